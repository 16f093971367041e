"""A job folder of many ranks for tests, built as ``bench/ranks_scale.py`` builds its folders
(its ``build_job``, imported, not copied): one real fake-backend run of a 2-D TP + FSDP2
transformer, every rank derived from it with latencies of its own, a slow rank and a rank that
skipped a call planted, the way issue 32's 1,024-rank job had them.

>>> job = write_job(tmp / "job", ranks=64)      # doctest: +SKIP
>>> job.slow, job.slow_steps, job.skip, job.skip_step       # doctest: +SKIP
(45, (2, 3), 25, 3)

`shared_job(shared_run, 64)` is the same job made once per test run for every worker and module
that asks (tests/conftest.py's `shared_run`): read it, never write into it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import ranks_scale
finally:
    sys.path.remove(str(BENCH))

Job = ranks_scale.Job
SLOW_FACTOR = ranks_scale.SLOW_FACTOR
LAYERS, STEPS = 2, 4  # small: a test's real runs take seconds, not minutes

# the real runs of each world size, done once per test session: (ranks) -> the two roles' dumps
_roles: dict[int, tuple[Path, Path]] = {}


def write_job(folder: Path, ranks: int, late: dict[int, int] | None = None) -> Job:
    """`ranks` rank dumps (LAYERS blocks, STEPS steps, about 23 calls per step) in `folder`; the
    slow rank sits at 733/1024 of the world (slow on the last two steps) and the one that skipped
    a call at 402/1024 (in the last step). `late`: step -> a rank that arrives
    ``ranks_scale.LATE_S`` late at its tensor-parallel group's first call of that step."""
    job = ranks_scale.build_job(folder, ranks, layers=LAYERS, steps=STEPS, slow_steps=(STEPS - 2, STEPS - 1),
                                skip_step=STEPS - 1, roles=_roles.get(ranks), late=late)
    _roles[ranks] = job.roles
    return job


def shared_job(shared_run: Any, ranks: int) -> Job:
    """`write_job`'s `ranks`-rank job with its defaults, made once per test run by whichever
    worker asks first, and read by all. Read-only: a test that plants more makes its own."""
    key = f"job{ranks}"
    shared_run.folder(key, lambda out: _as_json(write_job(out / "job", ranks)))
    job = _from_json(shared_run.result(key))
    _roles.setdefault(ranks, job.roles)  # a later write_job of this world size reuses the real runs
    return job


def _as_json(job: Job) -> dict[str, Any]:
    fields = dataclasses.asdict(job)
    fields["folder"], fields["roles"] = str(job.folder), [str(p) for p in job.roles]
    return fields


def _from_json(fields: dict[str, Any]) -> Job:
    return Job(**{**fields, "folder": Path(fields["folder"]), "roles": tuple(Path(p) for p in fields["roles"]),
                  "slow_steps": tuple(fields["slow_steps"]), "late": tuple(tuple(x) for x in fields["late"])})
