"""What recording costs per collective: a loop of tiny gloo all_reduces (world 1), the process's
CPU time per call (time.process_time: the gloo thread's wake-up latency does not count), with
and without 8 MB of memory swept between calls (a training step's own work sweeps the CPU's
caches between two collectives; the sweep costs every variant the same).

Variants alternate in blocks inside one process, the order rotated each round, and each one's
added cost is its block minus the bare block of the same round: a burst of load on a shared
machine spoils a round, not the comparison. Each block's recording issues one call before the
timer starts: what a recording pays once, at its first call (the process group's metadata, the
issue log's file opened), is not a cost per collective, and in a block of 20 swept calls it
read as 4-8 us more a call. Printed: the median over rounds and the spread (25th-75th
percentile) of each.

The process's CPU time includes gloo's worker thread, whose share depends on when the caller
comes to wait (a wait that finds the call done does not sleep): a variant that does more work
can read cheaper. ``--backend fake`` runs the same loop on the fake process group, which has no
worker thread (and no Flight Recorder): all a recording costs is on the calling thread there,
with nothing to overlap it.

- bare: torch as it is, Flight Recorder on (torch's default: 2,000 entries);
- light: ``CommDebugMode(light=True)``, whose C++ kernel records a plain call itself; light,
  Python recording: the same kernel handing every call to the Python handler (what it does with
  a call it does not record itself); light, Python kernels: without the C++ kernel (what an
  install without a compiler gets);
- light + issue log: with ``commdebug run``'s streamer writing each call as it is issued (one
  ``os.write`` of one line); light + mapped issue log: the same line copied into a file-backed
  mapping instead (the other way to keep a call from a kill, measured here for comparison);
- full: the default capture (a dispatch mode); torch's CommDebugMode;
- bare with ``TORCH_FR_BUFFER_SIZE=0``, in a second process (Flight Recorder is set up when the
  process group is made): bare minus that is what Flight Recorder costs a call.

    python bench/percall.py [--rounds 40] [--calls 200] [--swept-calls 100] [--backend gloo|fake]
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commdebug import CommDebugMode  # noqa: E402  (the checkout's copy, by the path above)
from commdebug.capture import light as light_capture  # noqa: E402
from commdebug.capture.stepping import _SAID  # noqa: E402
from commdebug.demo import init_fake_world  # noqa: E402
from commdebug.launch.stream import Streamer  # noqa: E402
from commdebug.model.stream import issued_line  # noqa: E402

from ports import free_port  # noqa: E402  (bench/, this script's folder)

SWEEP_BYTES = 8 << 20


def init_gloo() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)


class Recording:
    """A recording entered for one block; ``setup(mode)`` adds what the variant adds to it."""

    def __init__(self, make: Callable[[], Any], setup: Callable[[Any], Callable[[], None]] | None = None) -> None:
        self.make, self.setup = make, setup

    def __enter__(self) -> None:
        self.mode = self.make()
        self.mode.__enter__()
        self.undo = self.setup(self.mode) if self.setup is not None else None

    def __exit__(self, *exc: object) -> None:
        if self.undo is not None:
            self.undo()
        self.mode.__exit__(None, None, None)


def python_kernels() -> Any:
    """Light capture without its C++ kernel, for comparison."""
    native = light_capture._native
    _SAID.add("native")  # its notice to users that the kernel is not built: here it is, left out on purpose

    class Fallback(CommDebugMode):
        def __enter__(self) -> Any:
            light_capture._native = None
            return super().__enter__()

        def __exit__(self, *exc: Any) -> None:
            super().__exit__(*exc)
            light_capture._native = native

    return Fallback(light=True)


def python_recording() -> Any:
    """Light capture with its C++ kernel handing every call to the Python handler (what it does
    for a call it does not record itself), for comparison."""

    class Handed(CommDebugMode):
        def _native_state(self) -> Any:
            return None

    return Handed(light=True)


def with_stream(folder: Path) -> Callable[[Any], Callable[[], None]]:
    def setup(mode: Any) -> Callable[[], None]:
        # no background flush during the block: only the issue log's writes are measured
        streamer = Streamer(mode, folder, rank_of=lambda meta: 0, interval=3600).start()
        return lambda: streamer.close(remove=True)

    return setup


def with_mapping(folder: Path) -> Callable[[Any], Callable[[], None]]:
    """The same issued line, copied into a file-backed mapping (a ring) instead of written."""

    def setup(mode: Any) -> Callable[[], None]:
        size = 1 << 22
        f = open(folder / "issued.map", "w+b")  # noqa: SIM115  (closed by the returned function)
        f.truncate(size)
        ring = mmap.mmap(f.fileno(), size)
        where = [0]
        named: set[str] = set()

        def issued(event: Any) -> None:
            group = event.group if event.group.name not in named else None
            named.add(event.group.name)
            data = issued_line(event, time.time(), group).encode()
            at = where[0] if where[0] + len(data) <= size else 0
            ring[at: at + len(data)] = data
            where[0] = at + len(data)

        mode.add_issue_listener(issued)

        def undo() -> None:
            mode.remove_issue_listener(issued)
            ring.close()
            f.close()

        return undo

    return setup


def variants(folder: Path) -> dict[str, Callable[[], Any] | None]:
    from torch.distributed.tensor.debug import CommDebugMode as TorchMode

    return {
        "bare": None,
        "light": lambda: Recording(lambda: CommDebugMode(light=True)),
        "light, Python recording": lambda: Recording(python_recording),
        "light, Python kernels": lambda: Recording(python_kernels),
        "light + issue log": lambda: Recording(lambda: CommDebugMode(light=True), with_stream(folder)),
        "light + mapped issue log": lambda: Recording(lambda: CommDebugMode(light=True), with_mapping(folder)),
        "full": lambda: Recording(lambda: CommDebugMode()),
        "torch CommDebugMode": lambda: Recording(TorchMode),
    }


def measure(names: dict[str, Callable[[], Any] | None], rounds: int, calls: int, swept_calls: int) -> dict[str, dict[str, list[float]]]:
    """{"hot"|"swept": {variant: [CPU seconds per call, one per round]}}."""
    t = torch.ones(4)
    sweep = torch.ones(SWEEP_BYTES // 4)

    def block(make: Callable[[], Any] | None, n: int, swept: bool) -> float:
        recording = make() if make is not None else None
        if recording is not None:
            recording.__enter__()
        try:
            # one call untimed: what a recording pays once, at its first call (the process
            # group's metadata read, the op's facts on the group, the issue log's file opened),
            # is not a cost per collective
            dist.all_reduce(t)
            start = time.process_time()
            for _ in range(n):
                if swept:
                    sweep.add_(1.0)
                dist.all_reduce(t)
            return (time.process_time() - start) / n
        finally:
            if recording is not None:
                recording.__exit__(None, None, None)

    order = list(names)
    for name in order:  # warm up: kernels registered once, code paths taken once
        block(names[name], 20, False)
    out: dict[str, dict[str, list[float]]] = {"hot": {n: [] for n in order}, "swept": {n: [] for n in order}}
    gc.disable()
    try:
        for r in range(rounds):
            k = r % len(order)
            for name in order[k:] + order[:k]:
                out["hot"][name].append(block(names[name], calls, False))
                out["swept"][name].append(block(names[name], swept_calls, True))
            gc.collect()
    finally:
        gc.enable()
    return out


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile) in microseconds."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return statistics.median(values) * 1e6, q[0] * 1e6, q[2] * 1e6


def added(times: dict[str, list[float]], name: str) -> tuple[float, float, float]:
    return spread([a - b for a, b in zip(times[name], times["bare"], strict=True)])


def child(args: argparse.Namespace) -> None:
    """The second process: bare only, with Flight Recorder off."""
    init_gloo()
    result = measure({"bare": None}, args.rounds, args.calls, args.swept_calls)
    print(json.dumps({kind: result[kind]["bare"] for kind in result}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200, help="calls per block without the sweep")
    parser.add_argument("--swept-calls", type=int, default=100, help="calls per block with the sweep")
    parser.add_argument("--backend", choices=["gloo", "fake"], default="gloo",
                        help="fake: no worker thread and no Flight Recorder (every cost on the calling thread)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    fr_off = None
    if args.backend == "gloo":
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "0"}
        off = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--calls", str(args.calls),
                              "--swept-calls", str(args.swept_calls)], capture_output=True, text=True, env=env, timeout=3600)
        if off.returncode != 0:
            sys.exit(f"the Flight Recorder-off process failed: {off.stderr[-2000:]}")
        fr_off = json.loads(off.stdout.strip().splitlines()[-1])
        init_gloo()
    else:
        init_fake_world(2)
    with tempfile.TemporaryDirectory() as tmp:
        times = measure(variants(Path(tmp)), args.rounds, args.calls, args.swept_calls)
    dist.destroy_process_group()

    def cell(value: tuple[float, float, float], sign: str = "") -> str:
        median, lo, hi = value
        return f"{sign}{median:6.2f} [{lo:6.2f} .. {hi:6.2f}]"

    native = "built" if light_capture._native is not None else "NOT built: light and its Python kernels are the same"
    what = "gloo all_reduce (world 1)" if fr_off is not None else "all_reduce on the fake process group (world 2, no worker thread)"
    print(f"CPU us per tiny {what}, {args.rounds} rounds, blocks of {args.calls} calls ({args.swept_calls} with "
          f"the sweep); median [25th .. 75th percentile] of rounds; added = variant minus bare of the same round. "
          f"Light capture's C++ kernel: {native}.")
    print(f"{'':<26} {'hot':<28} {'8 MB swept between calls':<28}")
    if fr_off is None:
        print(f"{'bare':<26} {cell(spread(times['hot']['bare']))}   {cell(spread(times['swept']['bare']))}")
    else:
        print(f"{'bare (Flight Recorder on)':<26} {cell(spread(times['hot']['bare']))}   {cell(spread(times['swept']['bare']))}")
        print(f"{'bare, Flight Recorder off':<26} {cell(spread(fr_off['hot']))}   {cell(spread(fr_off['swept']))}   (second process)")
        fr = [spread(times[k]["bare"])[0] - spread(fr_off[k])[0] for k in ("hot", "swept")]
        print(f"{'added: Flight Recorder':<26} {'+' + format(fr[0], '6.2f'):<28} {'+' + format(fr[1], '6.2f'):<28} (difference of the medians)")
    for name in times["hot"]:
        if name == "bare":
            continue
        print(f"{'added: ' + name:<26} {cell(added(times['hot'], name), '+')}  {cell(added(times['swept'], name), '+')}")


if __name__ == "__main__":
    main()
