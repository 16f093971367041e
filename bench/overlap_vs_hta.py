"""``commdebug overlap --json`` against HolisticTraceAnalysis 0.5.0 on the same torch.profiler
traces, as whole processes: the same figure, at least 10x faster, in less memory (issue 47).

Each round runs, one after the other (so both meet the same machine), a fresh process of HTA's
``TraceAnalysis(trace_dir=...).get_comm_comp_overlap()`` on a folder holding the trace, and a
fresh ``python -m commdebug overlap --json TRACE``. Each is timed from its start to its exit:
the interpreter's start and the imports count on both sides. Of each process the peak resident
memory and the CPU time are read from the kernel's account of it (``os.wait4``). One untimed run
of commdebug comes first, so that its modules are compiled as an install has them (HTA's are).

Printed per trace: both overlap percentages (commdebug's exact one, and with ``--round-us``,
HTA's rounding), the best of the rounds of each (wall and CPU time: on a machine other work
shares, the best says what the program costs), the ratios HTA / commdebug, and the peak memory
of each; then the least time ratio over the traces.

    python bench/overlap_vs_hta.py [TRACE ...] [--rounds 3]

Default traces: every trace under tests/data/kineto/ (its README says where they come from).
HTA must be importable (it is in the `test` extra); without it the bench says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "kineto"

HTA = """
import json, logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
result = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
print(json.dumps({int(r): float(p) for r, p in zip(result["rank"], result["comp_comm_overlap_pctg"])}))
"""


def _process(cmd: list[str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak MiB, stdout) of one process, from its start to its exit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: modules compiled once, not at every start
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: a full pipe would stall the child
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own account, not the sum of all children
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"overlap_vs_hta: {' '.join(cmd[:4])} ... failed ({proc.returncode}):\n"
                             f"{err.read().decode(errors='replace')[-2000:]}")
        out.seek(0)
        text = out.read().decode()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text


def _ours(trace: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "commdebug", "overlap", "--json", *extra, str(trace)]


def _percentages(text: str) -> dict[int, float]:
    return {r["rank"]: 100 * (r["overlap_ratio"] or 0.0) for r in json.loads(text)["ranks"]}


def compare(trace: Path, rounds: int) -> float:
    """Print one trace's figures; return HTA's best time over commdebug's."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)  # HTA reads folders
        shutil.copy(trace, folder / trace.name)
        theirs, ours = [], []
        _process(_ours(trace))  # not timed: compiles what an install would have compiled, reads the file once
        for _ in range(rounds):
            theirs.append(_process([sys.executable, "-c", HTA, str(folder)]))
            ours.append(_process(_ours(trace)))
    hta_pct = {int(k): v for k, v in json.loads(theirs[-1][3].strip().splitlines()[-1]).items()}
    our_pct = _percentages(ours[-1][3])
    rounded = _percentages(_process(_ours(trace, "--round-us"))[3])
    print(f"trace: {trace.relative_to(ROOT) if trace.is_relative_to(ROOT) else trace} ({trace.stat().st_size / 2**20:.1f} MiB), "
          f"{rounds} round{'s' if rounds != 1 else ''}")
    for rank in sorted(hta_pct):
        difference = round(our_pct[rank] - hta_pct[rank], 2) + 0.0  # + 0.0: no "-0.00"
        print(f"rank {rank}: HTA {hta_pct[rank]:.2f}%   commdebug {our_pct[rank]:.2f}% (--round-us {rounded[rank]:.2f}%)   "
              f"difference {difference:+.2f} points")
    hw, cw = min(r[0] for r in theirs), min(r[0] for r in ours)
    hc, cc = min(r[1] for r in theirs), min(r[1] for r in ours)
    hm, cm = max(r[2] for r in theirs), max(r[2] for r in ours)
    print(f"whole process, best of {rounds}: HTA {hw:.3f} s ({hc:.3f} s of CPU), commdebug {cw:.3f} s ({cc:.3f} s of CPU)")
    print(f"HTA/commdebug time    = {hw / cw:.1f}x")
    print(f"HTA/commdebug CPU     = {hc / cc:.1f}x")
    print(f"peak memory: HTA {hm:.0f} MiB, commdebug {cm:.0f} MiB (the most of any round)")
    print(f"HTA/commdebug memory  = {hm / cm:.1f}x")
    return hw / cw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", help="torch.profiler trace files (default: every trace under tests/data/kineto/)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running both (default 3; the best counts)")
    args = parser.parse_args()
    try:
        import hta  # noqa: F401
    except ImportError:
        print("overlap_vs_hta: HolisticTraceAnalysis is not installed (pip install holistictraceanalysis==0.5.0)", file=sys.stderr)
        return 1
    traces = [Path(t) for t in args.traces] or sorted(TRACES.rglob("*.json.gz"))
    for t in traces:
        if not t.is_file():
            print(f"overlap_vs_hta: {t}: no such trace file", file=sys.stderr)
            return 1
    ratios = []
    for t in traces:
        ratios.append(compare(t.resolve(), max(args.rounds, 1)))
        print()
    print(f"least HTA/commdebug time over {len(traces)} trace{'s' if len(traces) != 1 else ''} = {min(ratios):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
