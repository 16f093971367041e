"""Verdicts on real jobs: an FSDP2 training job (tests/programs/fsdp_job.py) on 2 gloo ranks
under torchrun and `commdebug run --hang-timeout`, healthy and with one rank skipping a metric
all_reduce. A healthy job must never be called hung; a real hang must be named, with the call
the other rank never issued and its source line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "fsdp_job.py"
METRIC_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "METRIC_ALL_REDUCE" in line)
DEADLINE_S = 150


def run_job(cwd: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """torchrun 2 ranks of the FSDP2 job under `commdebug run --out traces OPTIONS`."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--out", "traces", *options, "--", str(JOB)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=full_env, timeout=DEADLINE_S)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def sections(folder: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text())["commdebug"] for p in sorted(folder.glob("rank*.json"))}


@pytest.fixture(scope="module", params=["untimed", "timed"])
def healthy(request, tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp(f"healthy-{request.param}")
    timing = ["--timing"] if request.param == "timed" else []
    proc = run_job(cwd, "--hang-timeout", "1", *timing)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cwd / "stderr.txt").write_text(proc.stderr)
    return cwd


@pytest.mark.timeout(2 * DEADLINE_S)
def test_a_healthy_fsdp2_job_is_never_called_hung(healthy):
    stderr = (healthy / "stderr.txt").read_text()
    assert "stuck" not in stderr and "unfinished" not in stderr, stderr[-2000:]
    got = sections(healthy / "traces")
    assert sorted(got) == [0, 1]
    for section in got.values():
        assert section["metadata"]["ended_by"] == "exit"
        assert not any(section["events"]["columns"]["in_flight"])
        assert not any(section["events"]["columns"]["error"])
    # one launch, one run identity, shared by both ranks
    run_ids = {section["metadata"]["run_id"] for section in got.values()}
    assert len(run_ids) == 1 and None not in run_ids
    check = cli("check", str(healthy / "traces"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith("consistent: 2 ranks")


@pytest.mark.timeout(DEADLINE_S + 30)
def test_a_skipped_all_reduce_under_timing_is_the_first_finding(tmp_path):
    env = {"FSDP_SKIP_STEP": "2", "FSDP_PG_TIMEOUT": "6", "FSDP_STEPS": "4"}
    proc = run_job(tmp_path, "--timing", "--hang-timeout", "2", env=env)
    assert proc.returncode != 0
    # the watchdog names the call rank 0 waits in, not a finished reduce-scatter
    assert "commdebug: rank 0 stuck for" in proc.stderr
    stuck_line = next(line for line in proc.stderr.splitlines() if "commdebug: rank 0 stuck" in line)
    assert " in all_reduce #" in stuck_line and f"fsdp_job.py:{METRIC_LINE}" in stuck_line
    # rank 0 recorded the all_reduce it waited in, and that it failed
    rank0 = sections(tmp_path / "traces")[0]
    strings, columns = rank0["events"]["strings"], rank0["events"]["columns"]
    failed = [i for i, e in enumerate(columns["error"]) if e is not None]
    assert [strings[columns["op"][i]] for i in failed] == ["all_reduce"]
    assert strings[columns["source"][failed[0]]].endswith(f"fsdp_job.py:{METRIC_LINE}")
    check = cli("check", str(tmp_path / "traces"), "--json")
    assert check.returncode == 1, check.stderr
    first = json.loads(check.stdout)["findings"][0]
    rank0_side = next(side for side in first["sides"] if 0 in side["ranks"])
    assert rank0_side["op"] == "all_reduce" and rank0_side["source"].endswith(f"fsdp_job.py:{METRIC_LINE}")


@pytest.mark.timeout(2 * DEADLINE_S)
@pytest.mark.parametrize("healthy", ["untimed"], indirect=True)
def test_a_folder_mixing_two_runs_is_refused(tmp_path, healthy):
    mixed = tmp_path / "mixed"
    shutil.copytree(healthy / "traces", mixed)
    other = tmp_path / "other"
    other.mkdir()
    proc = run_job(other, env={"FSDP_STEPS": "2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    shutil.copy(other / "traces" / "rank1.json", mixed / "rank1.json")
    for verb in ("check", "report"):
        out = cli(verb, str(mixed))
        assert out.returncode == 2, (verb, out.stdout, out.stderr)
        # two ranks, two runs: no majority, so both files are named with their run ids
        assert "the dumps come from 2 runs, none the majority" in out.stderr, out.stderr
        assert "rank0.json (run_id " in out.stderr and "rank1.json (run_id " in out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1
