"""Offline tools at job scale: `check` and `report` over a folder of per-rank dumps.

Target (issue 8): 1,024 ranks x 10,000 events (10 million events) at >= 100k events/s on one
core, peak memory < 1 GiB whatever the number of ranks, and the planted mismatch found.

Generates a synthetic job: a 2-D mesh (tp groups of 8 consecutive ranks, dp groups of ranks
equal modulo 8), each rank issuing per step tp all_reduces and all_gathers and a dp
reduce_scatter, timed, with real schema-2 dumps written through the dump writer of one rank
and copied per rank with its rank and groups put in. One rank (the middle one) gets a planted
mismatch: one tp all_reduce twice as big. Then runs `check` and `report` in a fresh process
each, and prints events/s, peak RSS (ru_maxrss of that process) and whether the mismatch was
found. Then (issue 19) `commdebug trace` of every rank and of `--ranks 0-7`, gzip-compressed,
and `commdebug view` of the folder, each in a fresh process: their sizes and times, against the
targets (full trace < 100 MB as .json.gz and `--ranks 0-7` < 5 MB at 1,024 ranks x 2,000
events; `--no-trace` skips them).

    python bench/ranks_scale.py [--ranks 1024] [--events 10000] [--keep DIR] [--no-trace]
    python bench/ranks_scale.py --ranks 1024 --events 2000      # issue 19's folder (~310 MiB)

Writing the folder takes a few minutes and about 1 GB of disk at full size; `--ranks 64` is a
quick look.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_EVENTS_PER_S = 100_000
TARGET_RSS_MB = 1024
TARGET_TRACE_GZ_MB = 100  # the whole job's trace as .json.gz, at 1,024 ranks x 2,000 events
TARGET_TRACE_8_MB = 5     # --ranks 0-7
TP = 8
TARGET_CLI_EVENTS_PER_S = 600_000  # issue 32: the CLI on the 2-core machine, workers included
TARGET_CLI_MIB = 500


def _groups(rank: int, world: int):
    from commdebug.model.trace import GroupInfo

    tp0 = rank - rank % TP
    tp = GroupInfo(f"tp{tp0 // TP}", "mesh_tp", TP, tuple(range(tp0, tp0 + TP)))
    dp_ranks = tuple(range(rank % TP, world, TP))
    dp = GroupInfo(f"dp{rank % TP}", "mesh_dp", len(dp_ranks), dp_ranks)
    return tp, dp


def _events(rank: int, world: int, n: int, odd: bool):
    from commdebug import ops as _ops
    from commdebug.model.trace import CollectiveEvent

    tp, dp = _groups(rank, world)
    per_step = 10  # 6 tp all_reduce, 3 tp all_gather, 1 dp reduce_scatter
    seq = {tp.name: 0, dp.name: 0}
    out = []
    t = 0.0
    for i in range(n):
        step, k = divmod(i, per_step)
        layer = k % 3
        if k == 9:
            op, group, size, key = "reduce_scatter", dp, 1 << 20, "c10d._reduce_scatter_base_"
            inb, outb = size * dp.size, size
        elif k >= 6:
            op, group, size, key = "all_gather", tp, 1 << 18, "_c10d_functional.all_gather_into_tensor"
            inb, outb = size // TP, size
        else:
            op, group, size, key = "all_reduce", tp, 1 << 16, "_c10d_functional.all_reduce"
            inb = outb = size
        if odd and i == n // 2 and op == "all_reduce":  # the planted mismatch
            size = inb = outb = size * 2
        spec = _ops.spec_for_op(op)
        latency = 1e-4 + (size / 50e9)
        out.append(CollectiveEvent(
            i, op, key, key, step, "forward" if k < 6 else "backward", f"model.layers.{layer}", group, seq[group.name],
            "bfloat16", ((inb // 2,),), ((outb // 2,),), inb, outb, size, spec.busbw_factor(group.size),
            source=f"train.py:{100 + k}", latency_s=latency, start_s=t,
        ))
        seq[group.name] += 1
        t += latency + 5e-5
    return out


def write_folder(folder: Path, ranks: int, events: int) -> int:
    """Write the job's dumps; returns the rank with the planted mismatch."""
    from commdebug.fileio import write_output
    from commdebug.model.dump import to_dump_dict
    from commdebug.model.trace import Trace

    odd_rank = ranks // 2
    t0 = time.perf_counter()
    written = 0
    for rank in range(ranks):
        trace = Trace()
        for e in _events(rank, ranks, events, rank == odd_rank):
            trace.add_group(e.group)
            trace.add_event(e)
        trace.metadata.update({"rank": rank, "world_size": ranks, "backend": "nccl", "hostname": f"node{rank // 8}",
                               "elapsed_s": 60.0, "recorded_s": 60.0, "timing": "async"})
        write_output(folder / f"rank{rank}.json", json.dumps(to_dump_dict(trace, noise_level=0), separators=(",", ":")))
        written += 1
        if written % 128 == 0:
            print(f"  wrote {written}/{ranks} dumps ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return odd_rank


CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from commdebug.analysis.{module} import {func}
t0 = time.perf_counter()
result = {func}({folder!r})
dt = time.perf_counter() - t0
extra = {extra}
print(json.dumps({{"seconds": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "extra": extra}}))
"""


def _measure(module: str, func: str, folder: Path, extra: str) -> dict:
    code = CHILD.format(root=str(ROOT), module=module, func=func, folder=str(folder), extra=extra)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{func} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _timed_cli(*args: str) -> tuple[float, str]:
    """`commdebug ARGS` in a fresh process: (seconds, stdout); exits with its stderr if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"commdebug {' '.join(args)} failed:\n{proc.stderr}")
    return time.perf_counter() - t0, proc.stdout


def _cli_peak(*args: str) -> tuple[float, float]:
    """`commdebug ARGS` in a fresh process: (seconds, peak RSS in MiB of the largest process it or
    its workers reached); ru_maxrss of waited-for children is the largest of them, not a sum."""

    code = "import resource, sys, commdebug.cli as c; rc = c.main(sys.argv[1:]); " \
           "print(max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024, file=sys.stderr); sys.exit(rc)"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"commdebug {' '.join(args)} failed:\n{proc.stderr}")
    return seconds, float(proc.stderr.strip().splitlines()[-1])


def startup() -> None:
    """`commdebug --help` and `--version`: best of 5 fresh processes, ms and peak RSS."""
    import resource

    for flag in ("--help", "--version"):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "commdebug", flag], capture_output=True, check=True, cwd=ROOT)
            best = min(best, time.perf_counter() - t0)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"commdebug {flag:9}: {best * 1e3:.0f} ms (best of 5), peak RSS {rss:.0f} MiB")


def cli_rates(folder: Path, total: int, jobs: tuple[int, ...]) -> None:
    """`commdebug check` and `report` of the folder with each -j: events/s and peak RSS."""
    for verb in ("check", "report"):
        for j in jobs:
            seconds, rss = _cli_peak(verb, str(folder), "-q", "-j", str(j))
            rate = total / seconds
            print(f"commdebug {verb} -j {j}: {seconds:.1f} s, {rate:,.0f} events/s (target >= {TARGET_CLI_EVENTS_PER_S:,}: "
                  f"{rate / TARGET_CLI_EVENTS_PER_S:.2f}x), peak {rss:.0f} MiB per process (target <= {TARGET_CLI_MIB})")


def trace_and_view(folder: Path, out: Path) -> None:
    """Print the sizes and times of the job's traces (all ranks, ranks 0-7) and its folder page."""
    for what, options, target in (("trace, every rank", [], TARGET_TRACE_GZ_MB), ("trace --ranks 0-7", ["--ranks", "0-7"], TARGET_TRACE_8_MB)):
        path = out / f"trace{len(options)}.json.gz"
        seconds, stdout = _timed_cli("trace", str(folder), "-o", str(path), "--quiet", *options)
        mb = path.stat().st_size / 1e6
        with gzip.open(path, "rb") as f:
            raw = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
        print(f"{what:18}: {mb:.1f} MB as .json.gz ({raw / 1e6:.0f} MB of JSON), written in {seconds:.1f} s "
              f"(target < {target} MB: {mb / target:.2f}x)")
        print(f"  {stdout.splitlines()[0]}")
    seconds, _ = _timed_cli("view", str(folder), "-o", str(out / "index.html"), "--quiet")
    print(f"view              : {(out / 'index.html').stat().st_size / 2**20:.2f} MiB page, written in {seconds:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--keep", type=Path, help="write the folder here and keep it")
    ap.add_argument("--no-trace", dest="trace", action="store_false", help="skip the trace and view figures")
    ap.add_argument("--jobs", default="1,2", help="the -j values to time the CLI's check and report with (default 1,2)")
    args = ap.parse_args()
    startup()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="commdebug-ranks-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        odd = write_folder(folder, args.ranks, args.events)
        size = sum(p.stat().st_size for p in folder.iterdir())
        total = args.ranks * args.events
        print(f"folder: {args.ranks} ranks x {args.events} events = {total:,} events, {size / 2**20:.0f} MiB, written in {time.perf_counter() - t0:.0f} s")
        check = _measure("check", "check_path", folder,
                         "[(f.kind, f.group, f.seq, [s.ranks for s in f.sides]) for f in result.findings]")
        report = _measure("report", "report_path", folder, "len(result.ranks)")
        for name, m in (("check", check), ("report", report)):
            rate = total / m["seconds"]
            print(f"{name:6}: {m['seconds']:.1f} s, {rate:,.0f} events/s (target >= {TARGET_EVENTS_PER_S:,}: "
                  f"{rate / TARGET_EVENTS_PER_S:.2f}x), peak RSS {m['rss_mb']:.0f} MiB (target < {TARGET_RSS_MB}: {m['rss_mb'] / TARGET_RSS_MB:.2f}x)")
        cli_rates(folder, total, tuple(int(j) for j in args.jobs.split(",")))
        findings = check["extra"]
        found = any(kind == "mismatch" and [odd] in sides for kind, _, _, sides in findings)
        print(f"planted mismatch on rank {odd}: {'found' if found else 'NOT FOUND'} ({len(findings)} finding(s): {findings[:3]})")
        if not found:
            raise SystemExit(1)
        if args.trace:
            with tempfile.TemporaryDirectory() as out:
                trace_and_view(folder, Path(out))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
