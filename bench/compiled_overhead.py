"""What recording costs on a torch.compile'd program, next to what it costs on the same program eager.

The demo's tensor-parallel transformer (fake process group, world 8, CPU) with each block
compiled (``block.compile(fullgraph=True)``, Inductor), against the same model eager. One context
around ``--steps`` training steps per variant (as ``commdebug run`` records), variants rotated
each round, garbage collected outside the timer: bare, full capture, light capture. Prints the
medians and the per-round ratios, eager and compiled, and the number of Dynamo graphs each
recording added (0: the recording caused no recompilation).

    python bench/compiled_overhead.py [--rounds 7] [--layers 4] [--dim 64] [--steps 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from torch._dynamo.utils import counters

from commdebug import CommDebugMode
from commdebug.demo import ModelConfig, init_fake_world, tensor_parallel_transformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="steps per context")
    args = parser.parse_args()
    init_fake_world(8)
    tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))

    results = {}
    for compiled in (False, True):
        model = tensor_parallel_transformer(ModelConfig(n_layers=args.layers, dim=args.dim), 8)
        if compiled:
            for block in model.layers:
                block.compile(fullgraph=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

        def train(model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer) -> None:
            model(tokens).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def run(make) -> float:
            mode = make()
            gc.collect()
            with mode if mode is not None else _Nothing():
                t = time.perf_counter()
                for _ in range(args.steps):
                    train()
                return (time.perf_counter() - t) / args.steps

        variants = [("bare", lambda: None), ("full", CommDebugMode), ("light", lambda: CommDebugMode(light=True))]
        train()  # compile (or warm up) outside any recording
        graphs = counters["stats"]["unique_graphs"]
        for _, make in variants:
            run(make)
        added = counters["stats"]["unique_graphs"] - graphs
        times: dict[str, list[float]] = {name: [] for name, _ in variants}
        for r in range(args.rounds):
            k = r % len(variants)
            for name, make in variants[k:] + variants[:k]:
                times[name].append(run(make))
        label = "compiled" if compiled else "eager"
        for name, v in times.items():
            print(f"{label:>8} {name:>5}: {statistics.median(v) * 1e3:8.2f} ms/step (median of {args.rounds})")
        for name in ("full", "light"):
            results[(label, name)] = statistics.median(x / y for x, y in zip(times[name], times["bare"], strict=True))
            results[(label, name, "ms")] = statistics.median(x - y for x, y in zip(times[name], times["bare"], strict=True)) * 1e3
        if compiled:
            print(f"graphs the recordings added to the compiled program: {added} (0: no recompilation)")
    for name in ("full", "light"):
        print(f"{name}/bare: eager {results[('eager', name)]:.3f}, compiled {results[('compiled', name)]:.3f}; "
              f"added per step: eager {results[('eager', name, 'ms')]:.2f} ms, compiled {results[('compiled', name, 'ms')]:.2f} ms")


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
