"""Nothing commdebug starts may change a job's exit status or outlive it, and what it says about
a live job must be true: real two-rank gloo jobs under torchrun (tests/programs/live_job.py).

- healthy jobs with the debug server and metrics exit 0 and leave no process and no listening
  port behind (torch 2.13 aborted every such rank at interpreter shutdown: exit -6, torchrun 1);
- ``watch`` started before the job waits for it, then shows both ranks;
- ``check`` during a live hang says hung, from the watchdog's dumps, while the streams are still
  being touched;
- SIGTERM that arrives while Python code runs leaves dumps with their end time and durations,
  and each rank says so on stderr, before and after writing its dump.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_watch import free_port, poll

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from soak import alive, listening  # noqa: E402  (the soak bench's own checks: one definition of "left behind")

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

LIVE = ROOT / "tests" / "programs" / "live_job.py"
DEADLINE_S = 120
HEALTHY_RUNS = 3


def _torchrun(cwd: Path, env: dict[str, str], *options: str) -> list[str]:
    program = cwd / "job.py"  # a path of this test's own, to find the job's processes by
    if not program.exists():
        shutil.copy(LIVE, program)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "-m", "commdebug", "run", "--out", "traces", *options, "--", str(program)]


def _env(**values: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **values}


def _pid(path: Path) -> int | None:
    """The pid a rank wrote in its stream's header or its dump."""
    try:
        if path.suffix == ".jsonl":
            return json.loads(path.read_text().splitlines()[0])["metadata"].get("pid")
        return json.loads(path.read_text())["commdebug"]["metadata"].get("pid")
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _stop(job: subprocess.Popen, cwd: Path) -> None:
    """End a job and everything it started (torchrun puts each rank in a session of its own)."""
    for pid in {_pid(p) for p in (cwd / "traces").glob("rank*.json*")} - {None}:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait(timeout=30)


@pytest.mark.timeout(DEADLINE_S * HEALTHY_RUNS + 60)
def test_healthy_jobs_with_the_debug_server_and_metrics_exit_0_and_leave_nothing_behind_and_watch_waits_for_them(tmp_path):
    debug, metrics = free_port(), free_port(2)
    # started before the job exists, as one would in a second terminal
    watcher = subprocess.Popen([sys.executable, "-m", "commdebug", "watch", "traces", "--interval", "0.5"], cwd=tmp_path,
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for run in range(HEALTHY_RUNS):
            shutil.rmtree(tmp_path / "traces", ignore_errors=True)
            cmd = _torchrun(tmp_path, {}, "--debug-server", str(debug), "--metrics-port", str(metrics))
            job = subprocess.run(cmd, cwd=tmp_path, env=_env(LIVE_STEPS="3"), capture_output=True, text=True, timeout=DEADLINE_S)
            out = job.stdout + job.stderr
            assert job.returncode == 0, f"run {run}: torchrun exited {job.returncode}\n{out[-4000:]}"
            assert "Fatal Python error" not in out and "SIGTERM: dump written" not in out, out[-4000:]
            assert out.count("program finished (exit 0); dump complete") == 2, out[-4000:]
            left = poll(lambda: not alive(str(tmp_path / "job.py")), time.monotonic() + 20, 0.2)
            assert left, f"run {run}: processes outlived the job: {alive(str(tmp_path / 'job.py'))}"
            for port in (debug, metrics, metrics + 1):
                assert poll(lambda port=port: not listening(port), time.monotonic() + 10, 0.2), f"run {run}: port {port} still listened on"
            for rank in (0, 1):
                meta = json.loads((tmp_path / "traces" / f"rank{rank}.json").read_text())["commdebug"]["metadata"]
                assert meta["ended_by"] == "exit", meta
            if run == 0:
                watcher.send_signal(signal.SIGINT)
                shown, _ = watcher.communicate(timeout=30)
                lines = shown.splitlines()
                assert lines[0] == "commdebug watch: waiting for traces and the first rank's stream (Ctrl-C to stop)", shown
                assert sum(line.startswith("commdebug watch traces: 2 ranks") for line in lines) >= 1, shown
                assert "Traceback" not in shown.replace("KeyboardInterrupt", ""), shown
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
            watcher.wait(timeout=30)


@pytest.mark.timeout(DEADLINE_S + 60)
def test_check_during_a_live_hang_says_hung_from_the_watchdog_dumps(tmp_path):
    cmd = _torchrun(tmp_path, {}, "--hang-timeout", "2")
    job = subprocess.Popen(cmd, cwd=tmp_path, env=_env(LIVE_BAD="apart", LIVE_AT="2", LIVE_PG_TIMEOUT="300"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    traces = tmp_path / "traces"
    try:
        both = poll(lambda: all((traces / f"rank{r}.json").exists() for r in (0, 1)), time.monotonic() + DEADLINE_S, 0.5)
        assert both, f"no hang dumps: {sorted(p.name for p in traces.glob('*'))}"
        # the streams go on being touched after the dumps (the ranks are alive, hung): they become newer on disk
        newer = poll(lambda: all((traces / f"rank{r}.jsonl").stat().st_mtime > (traces / f"rank{r}.json").stat().st_mtime
                                 for r in (0, 1)), time.monotonic() + 30, 0.2)
        assert newer, "the streams were not touched after the hang dumps"
        check = subprocess.run([sys.executable, "-m", "commdebug", "check", "traces"], cwd=tmp_path, env=_env(),
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 1, check.stdout + check.stderr
        for rank in (0, 1):
            assert f"rank {rank}: hung (dump written by the hang watchdog)" in check.stdout, check.stdout
        assert "no final dump" not in check.stdout and "killed" not in check.stdout, check.stdout
        data = json.loads(subprocess.run([sys.executable, "-m", "commdebug", "check", "traces", "--json"], cwd=tmp_path,
                                         env=_env(), capture_output=True, text=True, timeout=60).stdout)
        assert [r["ended_by"] for r in data["rank_summaries"]] == ["hang", "hang"], data["rank_summaries"]
    finally:
        _stop(job, tmp_path)


@pytest.mark.timeout(DEADLINE_S + 60)
def test_sigterm_while_python_code_runs_leaves_end_times(tmp_path):
    job = subprocess.Popen(_torchrun(tmp_path, {}), cwd=tmp_path, env=_env(LIVE_BAD="spin", LIVE_AT="1"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        ready = poll(lambda: all((tmp_path / f"ready{r}").exists() for r in (0, 1)), time.monotonic() + DEADLINE_S, 0.2)
        assert ready, "the ranks never reached their loop"
        # each rank writes its file and enters its loop at once: from here on it runs Python code
        job.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks, each busy in Python
        out, _ = job.communicate(timeout=60)
        lines = [line for line in out.splitlines() if line.startswith("commdebug:")]
        for rank in (0, 1):
            meta = json.loads((tmp_path / "traces" / f"rank{rank}.json").read_text())["commdebug"]["metadata"]
            assert meta["ended_by"] == "SIGTERM", meta
            assert meta["end_time"] and meta["elapsed_s"] > 0 and meta["recorded_s"] > 0, meta
            # each rank says how its program ended before it writes its dump (a launcher may kill
            # it a moment later), then that the dump is complete
            said = f"commdebug: rank {rank} (pid {meta['pid']}): program ended by SIGTERM; writing its dump to traces/rank{rank}.json"
            done = f"commdebug: program ended by SIGTERM; dump complete: traces/rank{rank}.json"
            assert said in lines and done in lines and lines.index(said) < lines.index(done), out[-3000:]
    finally:
        if job.poll() is None:
            _stop(job, tmp_path)
