"""``commdebug overlap`` against HolisticTraceAnalysis 0.5.0 on the same torch.profiler trace:
the same figure, at least 10x faster, in less memory (issue 37).

Each round runs, in fresh processes one after the other (so both meet the same machine), HTA's
``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap()`` and commdebug's read of the trace +
:func:`commdebug.analysis.overlap.rank_overlap`; imports are done before the clock starts in both.
Printed: each one's overlap percentage per rank (commdebug's exact, and with ``--round-us``,
HTA's rounding), the median ratios HTA / commdebug of wall time and of CPU time (on a machine
other work shares, the CPU time says more), and the peak memory of each process (whole, and what
the work added over the process after its imports).

    python bench/overlap_vs_hta.py [TRACE_OR_FOLDER] [--rounds 5]

Default trace: the real NCCL trace in tests/data/kineto/ (its README says where it comes from).
HTA must be importable (it is in the `test` extra); without it the bench says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "kineto" / "nccl_data.json.gz"

_RSS = """
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
def peak_mib():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def cpu_s():
    import resource
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
"""

HTA = """
import json, logging, os, sys, time
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
""" + _RSS + """
base = rss_mib()
t, c = time.perf_counter(), cpu_s()
result = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
seconds, cpu = time.perf_counter() - t, cpu_s() - c
print(json.dumps({"seconds": seconds, "cpu": cpu, "peak": peak_mib(), "base": base,
                  "pct": {int(r): float(p) for r, p in zip(result["rank"], result["comp_comm_overlap_pctg"])}}))
"""

OURS = """
import json, os, sys, time
from pathlib import Path
from commdebug.analysis.overlap import rank_overlap
from commdebug.formats.readers import job_files, load_rank
""" + _RSS + """
files = job_files(sys.argv[1])
base = rss_mib()
t, c = time.perf_counter(), cpu_s()
pct, rounded = {}, {}
for f in files:
    view = load_rank(f)
    share = rank_overlap(view)
    pct[view.rank] = 100 * (share.figures.overlap_ratio or 0.0)
    del view
seconds, cpu = time.perf_counter() - t, cpu_s() - c
for f in files:
    rounded[load_rank(f).rank] = 100 * (rank_overlap(load_rank(f), round_us=True).figures.overlap_ratio or 0.0)
print(json.dumps({"seconds": seconds, "cpu": cpu, "peak": peak_mib(), "base": base, "pct": pct, "rounded": rounded}))
"""


def _run(code: str, folder: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"overlap_vs_hta: a run failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", default=str(TRACE), help="a trace file or a folder of one trace per rank (default: tests/data/kineto/nccl_data.json.gz)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each running both (default 5)")
    args = parser.parse_args()
    try:
        import hta  # noqa: F401
    except ImportError:
        print("overlap_vs_hta: HolisticTraceAnalysis is not installed (pip install holistictraceanalysis==0.5.0)", file=sys.stderr)
        return 1
    src = Path(args.trace)
    if not src.exists():
        print(f"overlap_vs_hta: {src}: no such trace", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if src.is_dir():
            folder = src
        else:  # HTA reads folders: one trace, named so both tools read rank 0 from it
            shutil.copy(src, folder / ("rank0.json.gz" if src.name.endswith(".gz") else "rank0.json"))
        hta_runs, our_runs = [], []
        for _ in range(args.rounds):
            hta_runs.append(_run(HTA, folder))
            our_runs.append(_run(OURS, folder))
    theirs, ours = hta_runs[-1], our_runs[-1]
    print(f"trace: {src} ({len(theirs['pct'])} rank{'s' if len(theirs['pct']) != 1 else ''}), {args.rounds} rounds")
    for rank in sorted(theirs["pct"], key=int):
        print(f"rank {rank}: HTA {theirs['pct'][rank]:.2f}%   commdebug {ours['pct'][rank]:.2f}% "
              f"(--round-us {ours['rounded'][rank]:.2f}%)   difference {ours['pct'][rank] - theirs['pct'][rank]:+.2f} points")
    hs = statistics.median(r["seconds"] for r in hta_runs)
    cs = statistics.median(r["seconds"] for r in our_runs)
    hc = statistics.median(r["cpu"] for r in hta_runs)
    cc = statistics.median(r["cpu"] for r in our_runs)
    print(f"parse + overlap: HTA {hs:.3f} s ({hc:.3f} s of CPU), commdebug {cs:.3f} s ({cc:.3f} s of CPU) (medians)")
    print(f"HTA/commdebug time    = {hs / cs:.1f}x")
    print(f"HTA/commdebug CPU     = {hc / cc:.1f}x")
    hp, cp = statistics.median(r["peak"] for r in hta_runs), statistics.median(r["peak"] for r in our_runs)
    hw = statistics.median(r["peak"] - r["base"] for r in hta_runs)
    cw = statistics.median(r["peak"] - r["base"] for r in our_runs)
    print(f"peak memory: HTA {hp:.0f} MiB ({hw:.0f} MiB for the work), commdebug {cp:.0f} MiB ({cw:.0f} MiB for the work)")
    print(f"HTA/commdebug memory  = {hp / cp:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
