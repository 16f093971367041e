"""Memory a CommDebugMode keeps: torch's after one step, ours after 1, 10, 100 and 300 steps (`--steps`).

Retained bytes are measured with tracemalloc as what is still allocated once the step's
tensors are gone, i.e. what the mode holds. Ours aggregates ops and caps events, so it should
grow only with events (until max_events) while the reference keeps a dict per op.

    python bench/memory.py [--layers 4] [--max-events 1000]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import torch

from commdebug import CommDebugMode
from commdebug.demo import ModelConfig, init_fake_world, tensor_parallel_transformer
from commdebug.units import format_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-events", type=int, default=1000, help="ours' event cap (default 1000; the library default is 20000)")
    parser.add_argument("--steps", type=int, default=300, help="the longest recording, in steps; also measured at a third of it (default 300)")
    args = parser.parse_args()

    init_fake_world(8)
    from torch.distributed.tensor.debug import CommDebugMode as ReferenceMode

    model = tensor_parallel_transformer(ModelConfig(n_layers=args.layers), 8)
    tokens = torch.randint(0, 256, (4, 16))

    def step() -> None:
        model(tokens).sum().backward()
        model.zero_grad(set_to_none=True)

    step()  # warm caches outside the measurement

    def retained(make, steps: int) -> int:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        mode = make()
        with mode:
            for _ in range(steps):
                step()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del mode
        return held

    ref = retained(ReferenceMode, 1)
    print(f"reference, 1 step: {format_bytes(ref)} retained")
    ours = {}
    long, mid = args.steps, max(1, args.steps // 3)
    for steps in sorted({1, 10, mid, long}):
        ours[steps] = retained(lambda: CommDebugMode(max_events=args.max_events), steps)
        print(f"ours, {steps:>3} steps: {format_bytes(ours[steps])} retained")
    one = CommDebugMode()
    with one:
        step()
    per_step = one.get_total_counts()
    capped_at = -(-args.max_events // per_step)
    print(f"ours/reference after 1 step  = {ours[1] / ref:.2f}")
    print(f"ours {long} steps / {mid} steps   = {ours[long] / ours[mid]:.2f}   "
          f"({per_step} collectives a step: the {args.max_events}-event cap is reached at step {capped_at}; "
          "ops are aggregated from step 1)")


if __name__ == "__main__":
    main()
