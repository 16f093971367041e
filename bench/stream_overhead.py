"""What streaming and metrics add to a recording session (docs/streaming.md): the whole-run case
of bench/overhead.py (one recording around ``--run-steps`` training steps of the 12-layer
tensor-parallel transformer, fake process group, world 8, CPU, an optimizer marking the
steps), under a RecordingSession with streaming off, on, and on with Prometheus metrics, for
light and full capture, alternating in one run (order rotated each round). Prints medians and
ratios to the session without streaming.

    python bench/stream_overhead.py [--rounds 9] [--layers 12] [--run-steps 10]
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import tempfile
import time

import torch

from commdebug.demo import ModelConfig, init_fake_world, tensor_parallel_transformer
from commdebug.launch.session import RecordingSession

from ports import free_port  # bench/, this script's folder

WARM = 2  # steps of each session left out of its time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--run-steps", type=int, default=10)
    args = parser.parse_args()
    logging.getLogger("commdebug").setLevel(logging.ERROR)

    init_fake_world(args.world_size)
    model = tensor_parallel_transformer(ModelConfig(n_layers=args.layers), args.world_size)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (4, 16))
    out = tempfile.mkdtemp(prefix="commdebug-bench-")

    def run(**session: object) -> float:
        s = RecordingSession(out, html=False, **session)
        s.start()
        gc.collect()
        for i in range(WARM + args.run_steps):
            if i == WARM:  # a session's first steps pay one-off costs (light capture's kernels, caches)
                t0 = time.perf_counter()
            model(tokens).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - t0  # the training loop only: the dump at exit is the same in all
        s.finish()
        return elapsed / args.run_steps

    variants = {}
    for capture in ("light", "full"):
        light = capture == "light"
        variants[f"{capture}-nostream"] = lambda light=light: run(light=light, stream=False)
        variants[f"{capture}-stream"] = lambda light=light: run(light=light, stream=True)
        variants[f"{capture}-stream+metrics"] = lambda light=light: run(light=light, stream=True, metrics_port=free_port())
    names = list(variants)
    for name in names:  # warm up
        variants[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(variants[name]())
    med = {n: statistics.median(v) for n, v in times.items()}
    print(f"per step (ms), median of {args.rounds} rounds, {args.run_steps} steps per session:")
    for name in names:
        base = med[name.split("-")[0] + "-nostream"]
        print(f"  {name:24s} {med[name] * 1e3:8.2f} ms   x{med[name] / base:.3f} of {name.split('-')[0]} without streaming")


if __name__ == "__main__":
    main()
