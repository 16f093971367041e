"""timing="events" on a GPU: its latencies against the profiler's NCCL kernel times on the same
steps, and what it costs a step. Run by bench/gpu/check.sh on the folder it fills:

    python bench/gpu/events_check.py WORKDIR

WORKDIR/events holds rank0.json and rank0.profile.json.gz (`commdebug run --timing events
--profile-steps 2-3` of bench/gpu/nccl_job.py); WORKDIR/steps_{bare,events,sync}.json the step
times of the same job bare, under `--light --timing events` and `--light --timing sync`. Prints
each synchronous collective of 64 MiB or more of the profiled steps (the job's own calls, at
`Global`) with both times and their ratio, then the step times' medians and ratios, each with
the bound the issue set: within 10% of the kernel, within 2% of the bare step.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import commdebug  # noqa: E402  (the repository's copy, by the path above)

BIG = 64 << 20
STEPS = (2, 3)


def nccl_kernels(profile: dict) -> list[tuple[float, float]]:
    """(start us, duration us) of each NCCL kernel in a torch.profiler trace, in start order."""
    kernels = [(float(e["ts"]), float(e["dur"])) for e in profile.get("traceEvents", [])
               if e.get("cat") == "kernel" and str(e.get("name", "")).startswith(("ncclKernel", "ncclDevKernel"))]
    return sorted(kernels)


def pair(events: list, kernels: list[tuple[float, float]]) -> list[tuple[object, float]] | str:
    """Each event of the profiled steps with its kernel's duration in seconds, in issue order (one
    NCCL stream per group, one group here: the kernels run in the order the calls were made); a
    sentence when the counts differ."""
    mine = [e for e in events if e.step in STEPS]
    if len(mine) != len(kernels):
        return f"{len(mine)} collectives in steps {STEPS[0]}-{STEPS[-1]} of the dump, {len(kernels)} NCCL kernels in the profile: not paired"
    return [(e, dur / 1e6) for e, (_, dur) in zip(mine, kernels, strict=True)]


def compare(pairs: list[tuple[object, float]]) -> list[str]:
    """One line per synchronous call of 64 MiB or more: event latency, kernel time, ratio, bound."""
    lines = []
    for e, kernel_s in pairs:
        if getattr(e, "module", None) != "Global" or e.size_bytes < BIG:  # the job's own synchronous calls
            continue
        if e.latency_s is None:
            lines.append(f"{e.op} #{e.seq} step {e.step}: no latency recorded  FAIL")
            continue
        ratio = e.latency_s / kernel_s
        verdict = "ok" if abs(ratio - 1) <= 0.10 else "FAIL"
        lines.append(f"{e.op} #{e.seq} step {e.step} {e.size_bytes >> 20} MiB: events {e.latency_s * 1e3:.3f} ms, "
                     f"kernel {kernel_s * 1e3:.3f} ms, ratio {ratio:.3f} (within 10%: {verdict})")
    return lines


def step_times(work: Path) -> list[str]:
    found = {}
    for name in ("bare", "events", "sync"):
        path = work / f"steps_{name}.json"
        if path.is_file():
            found[name] = json.loads(path.read_text())["steps"][2:]  # the first steps warm up
    if "bare" not in found:
        return ["no bare step times"]
    bare = statistics.median(found["bare"])
    lines = [f"step time bare: median {bare * 1e3:.2f} ms over {len(found['bare'])} steps"]
    for name, bound in (("events", 0.02), ("sync", None)):
        if name in found:
            median = statistics.median(found[name])
            ratio = median / bare
            tail = f" (within 2%: {'ok' if ratio - 1 <= bound else 'FAIL'})" if bound is not None else " (waits for each collective)"
            lines.append(f"step time --timing {name}: median {median * 1e3:.2f} ms, {ratio:.3f}x bare{tail}")
    return lines


def main() -> int:
    work = Path(sys.argv[1])
    dump = commdebug.load(work / "events" / "rank0.json")
    with gzip.open(work / "events" / "rank0.profile.json.gz", "rt") as f:
        kernels = nccl_kernels(json.load(f))
    paired = pair(list(dump.events), kernels)
    print(paired if isinstance(paired, str) else "\n".join(compare(paired)))
    print("\n".join(step_times(work)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
