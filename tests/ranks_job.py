"""A job folder of many ranks for tests, written as ``bench/ranks_scale.py`` writes its folders
(its ``write_folder``, imported, not copied), with a slow rank and a rank that skipped a call
planted on top, the way issue 32's 1,024-rank job had them.

>>> job = write_job(tmp / "job", ranks=64, events=40)      # doctest: +SKIP
>>> job.slow, job.slow_steps, job.skip, job.skip_step       # doctest: +SKIP
(45, (2, 3), 25, 3)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import commdebug
from commdebug.model.dump import to_dump_dict

BENCH = Path(__file__).resolve().parents[1] / "bench"
SLOW_FACTOR = 5.0


@dataclass(frozen=True)
class Job:
    folder: Path
    ranks: int
    steps: int
    slow: int  # this rank's calls are SLOW_FACTOR times slower at slow_steps
    slow_steps: tuple[int, ...]
    skip: int  # this rank skipped one all_reduce at skip_step
    skip_step: int
    mismatch: int  # the bench's own planted mismatch (one all_reduce twice as big)


def _bench_write_folder():
    sys.path.insert(0, str(BENCH))
    try:
        import ranks_scale
    finally:
        sys.path.remove(str(BENCH))
    return ranks_scale.write_folder


def _rewrite(path: Path, change) -> None:
    trace = commdebug.load(path)
    events = change(list(trace.events))
    trace.events.clear()
    trace.events.extend(events)
    trace.events_total = len(events)
    path.write_text(json.dumps(to_dump_dict(trace, noise_level=0), separators=(",", ":")), encoding="utf-8")


def write_job(folder: Path, ranks: int, events: int = 40) -> Job:
    """`ranks` rank dumps of `events` calls each (10 per step) in `folder`; the slow rank sits at
    733/1024 of the world and the one that skipped a call at 402/1024 (733 and 402 at 1,024)."""
    folder.mkdir(parents=True, exist_ok=True)
    mismatch = _bench_write_folder()(folder, ranks, events)
    steps = events // 10
    slow, skip = ranks * 733 // 1024, ranks * 402 // 1024
    slow_steps, skip_step = (steps - 2, steps - 1), steps - 1
    _rewrite(folder / f"rank{slow}.json", lambda evs: [
        e._replace(latency_s=e.latency_s * SLOW_FACTOR) if e.step in slow_steps else e for e in evs])

    def drop_an_all_reduce(evs):  # its first of the step: the calls after it no longer pair
        i = min(k for k, e in enumerate(evs) if e.step == skip_step and e.op == "all_reduce")
        group = evs[i].group.name  # never issued: the group's later calls take one sequence number less
        return evs[:i] + [e._replace(seq=e.seq - 1) if e.group.name == group else e for e in evs[i + 1:]]

    _rewrite(folder / f"rank{skip}.json", drop_an_all_reduce)
    return Job(folder, ranks, steps, slow, slow_steps, skip, skip_step, mismatch)
