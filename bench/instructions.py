"""What light capture adds to a training step, counted instead of timed: instructions, and the
misses of simulated caches, under Valgrind's cachegrind.

bench/overhead.py times steps, and a 2-core shared machine's noise (about 1% of a step from one
run to the next) hides any change to the capture path smaller than that. Counts do not drift:
the same program counts the same within a few tenths of a percent, so this bench can tell a
change worth 0.3% of a step from no change. It runs the whole-run workload of
bench/overhead.py (12-layer TP stack, fake process group, world 8, an optimizer) in a child
process under cachegrind, once with ``--steps`` A and once with B training steps in one
context per variant, and divides the difference by B - A: what one steady step costs, without
the start-up (importing torch, building the model, a context's first step).

Cachegrind simulates a first-level instruction cache, a first-level data cache and one last
level, sized here as this machine's per-core L2 (``--ll``): its misses are what goes out to the
shared L3 or to memory. A miss costs tens of instructions' time, so the capture's cost on a
step is mostly in its misses, not its instructions: read the four rows together. Garbage
collection is off in the child (it would land in some runs and not others), and so is
address-space randomisation where ``setarch`` is there (hashes of ids would differ).

    python bench/instructions.py [--variants bare,light] [--steps 5 25] [--layers 12] [--dim 64]

Needs ``valgrind`` on the PATH (Debian: ``apt-get install valgrind``); each run takes about
three minutes on the CI machine, two at a time.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = {"I refs": "instructions", "I1 misses": "I1 misses", "D1 misses": "D1 misses", "LL misses": "LL misses"}
VARIANTS = ("bare", "light", "detail10", "full")


def parse_summary(text: str) -> dict[str, int]:
    """The totals of cachegrind's summary (its stderr): {"instructions": ..., "I1 misses": ...,
    "D1 misses": ..., "LL misses": ...}. Raises ValueError naming what is missing."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"==\d+== (I   refs|I1  misses|D1  misses|LL misses):\s+([\d,]+)", line)
        if match:
            found[COUNTERS[" ".join(match.group(1).split())]] = int(match.group(2).replace(",", ""))
    missing = [name for name in COUNTERS.values() if name not in found]
    if missing:
        raise ValueError(f"cachegrind printed no {', '.join(missing)} (is this its summary?)")
    return found


def per_step(few: dict[str, int], many: dict[str, int], steps: int) -> dict[str, float]:
    """What one step adds: the difference of two runs that differ only by ``steps`` steps."""
    return {name: (many[name] - few[name]) / steps for name in COUNTERS.values()}


def child(variant: str, steps: int, layers: int, dim: int) -> None:
    """The measured program: set-up and warm-up, then ``steps`` steps of ``variant``."""
    import gc

    import torch

    torch.set_num_threads(1)
    from commdebug import CommDebugMode
    from commdebug.demo import ModelConfig, init_fake_world, tensor_parallel_transformer

    init_fake_world(8)
    model = tensor_parallel_transformer(ModelConfig(n_layers=layers, dim=dim), 8)
    tokens = torch.randint(0, 256, (4, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def train() -> None:
        model(tokens).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # sharding propagation's caches, the allocator
        train()
    for warm in (CommDebugMode(light=True), CommDebugMode()):  # what a first recording loads
        with warm:
            train()
    make = {"bare": lambda: None, "light": lambda: CommDebugMode(light=True),
            "detail10": lambda: CommDebugMode(detail_every=10), "full": lambda: CommDebugMode()}[variant]
    mode = make()
    gc.collect()
    gc.disable()
    if mode is not None:
        mode.__enter__()
    train()  # the context's first step (every module seen anew): in both runs, so it cancels
    for _ in range(steps):
        train()
    if mode is not None:
        mode.__exit__(None, None, None)


def measure(variant: str, steps: int, args: argparse.Namespace) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        # address-space randomisation off: dicts keyed by ids and addresses then hash alike in
        # every run, and two runs of one program count the same to a few hundred instructions
        # (with it on, the bare step's count moved by 1.6% from one run to the next)
        fixed = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
        command = [*fixed, "valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={args.ll}",
                   f"--cachegrind-out-file={os.path.join(tmp, 'out')}", sys.executable, __file__,
                   "--child", variant, str(steps), "--layers", str(args.layers), "--dim", str(args.dim)]
        # one thread (no pool spinning a varying number of times) and one hash seed: the counts
        # of two runs then differ by the steps alone
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=args.timeout)
    if run.returncode != 0:
        sys.exit(f"instructions.py: the {variant} run with {steps} steps failed:\n{run.stderr[-2000:]}")
    return parse_summary(run.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="bare,light", help=f"comma-separated, from {', '.join(VARIANTS)}; bare first")
    parser.add_argument("--steps", type=int, nargs=2, default=(5, 25), metavar=("A", "B"))
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--ll", default="4194304,16,64", help="last-level cache simulated: size,ways,line (bytes)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.layers, args.dim)
        return
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or variants[0] != "bare":
        sys.exit(f"instructions.py: --variants takes {', '.join(VARIANTS)}, bare first (got {args.variants})")
    few, many = sorted(args.steps)
    if few == many:
        sys.exit("instructions.py: --steps needs two different step counts")
    if shutil.which("valgrind") is None:
        sys.exit("instructions.py: valgrind is not on the PATH (Debian: apt-get install valgrind); "
                 "bench/overhead.py times the same workload without it")
    runs = [(v, s) for v in variants for s in (few, many)]
    print(f"{len(runs)} runs under cachegrind, {args.jobs} at a time (a few minutes each)...", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(runs, pool.map(lambda r: measure(r[0], r[1], args), runs), strict=True))
    steps = {v: per_step(counts[(v, few)], counts[(v, many)], many - few) for v in variants}
    print(f"per step ({args.layers}-layer TP, D={args.dim}, fake PG world 8; steps {few} and {many}, "
          f"last level simulated as {args.ll})")
    print(f"{'':>14}" + "".join(f"{v:>16}" for v in variants) + "".join(f"{v + '/bare':>14}" for v in variants[1:]))
    for name in COUNTERS.values():
        row = "".join(f"{steps[v][name]:>16,.0f}" for v in variants)
        row += "".join(f"{steps[v][name] / steps['bare'][name]:>14.3f}" for v in variants[1:])
        print(f"{name:>14}{row}")


if __name__ == "__main__":
    main()
