"""`commdebug watch` (docs/watch.md), Prometheus metrics (docs/metrics.md) and the /commdebug
page on torch's debug server (docs/debug-server.md), on one real gloo job under torchrun where
rank 1 sleeps at step 2 while rank 0 waits in its all_reduce; and the verdicts on states made
here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from commdebug.analysis.watch import Call, RankLive, watch
from commdebug.render.watch import render_watch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from soak import free_port  # noqa: E402  (one way to find free ports, the soak bench's)

LIVE = ROOT / "tests" / "programs" / "live_job.py"
GRAD_LINE = next(i for i, line in enumerate(LIVE.read_text().splitlines(), 1) if "GRAD_ALL_REDUCE" in line)
DEADLINE_S = 120


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()
    except OSError:
        return None


def poll(what, deadline: float, pause: float = 1.0):
    """``what()`` until it returns something true or the deadline passes (then its last value)."""
    value = what()
    while not value and time.monotonic() < deadline:
        time.sleep(pause)
        value = what()
    return value


@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_stalled_rank_is_named_by_watch_metrics_and_the_debug_server(tmp_path):
    metrics, debug = free_port(2), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIVE_BAD": "sleep", "LIVE_AT": "2", "LIVE_SLEEP": "600", "LIVE_PG_TIMEOUT": "300"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "commdebug", "run",
           "--out", "traces", "--metrics-port", str(metrics), "--debug-server", str(debug), "--", str(LIVE)]
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + DEADLINE_S
    try:
        def stalled():
            if not (tmp_path / "traces").is_dir() or len(list((tmp_path / "traces").glob("rank*.jsonl"))) < 2:
                return None
            proc = subprocess.run([sys.executable, "-m", "commdebug", "watch", "traces", "--once", "--stall-after", "5"],
                                  capture_output=True, text=True, cwd=tmp_path, timeout=60)
            return proc if proc.returncode == 1 else None

        frame = poll(stalled, deadline)
        assert frame, "watch never said a rank stalled"
        verdict = frame.stdout.splitlines()[-1]
        assert verdict.startswith("STALLED: rank 1 (no progress for "), frame.stdout
        assert f"while rank 0 waits in all_reduce #4 on default_pg[2] in Global at {LIVE}:{GRAD_LINE}" in verdict

        # rank 0's metrics: every all_reduce it issued (2 steps of 2, and the one it waits in)
        def scraped():
            text = get(f"http://127.0.0.1:{metrics}/metrics") or ""
            counts = [float(v) for v in re.findall(r'^commdebug_collectives_total\{[^}]*op="all_reduce"[^}]*\} (\S+)$', text, re.M)]
            return text if counts and sum(counts) >= 5 else None

        text = poll(scraped, deadline)
        assert text, get(f"http://127.0.0.1:{metrics}/metrics")
        assert re.search(r"^commdebug_step 2\.0$", text, re.M) and re.search(r"^commdebug_collectives_in_flight 1\.0$", text, re.M)

        # the frontend on rank 0 asks both ranks, with no file in between
        page = poll(lambda: get(f"http://127.0.0.1:{debug}/commdebug?stall_after=5"), deadline)
        assert page and "STALLED: rank 1" in page, page
        data = json.loads(get(f"http://127.0.0.1:{debug}/commdebug/json?stall_after=5"))
        assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["stalled"] == [1]
        assert {r["rank"]: r["last"]["op"] for r in data["ranks"]} == {0: "all_reduce", 1: "all_reduce"}
        assert data["ranks"][0]["waiting"]["seq"] == 4
    finally:
        # torchrun starts each rank in a session of its own (with rank 0's debug frontend in it):
        # end every one, by the pids the ranks wrote in their streams, then the launcher
        for stream in (tmp_path / "traces").glob("rank*.jsonl"):
            pid = json.loads(stream.read_text().splitlines()[0])["metadata"].get("pid")
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)


def _rank(rank: int, step: int, progress: float, waiting: Call | None = None, heartbeat: float | None = None) -> RankLive:
    last = waiting or Call("all_reduce", "default_pg[4]", step * 2, "Global", "train.py:9", step)
    return RankLive(rank, None, step, progress, heartbeat if heartbeat is not None else progress, None, last, waiting)


def test_verdicts_on_states():
    now = 1000.0
    wait = Call("all_reduce", "default_pg[4]", 8, "Global", "train.py:9", 4, True, now - 70)
    healthy = watch([_rank(r, 4, now - 1) for r in range(4)], now=now)
    assert healthy.healthy and render_watch(healthy).splitlines()[-1] == "healthy: 4 running"

    stalled = watch([_rank(0, 4, now - 70, wait), _rank(1, 4, now - 70, heartbeat=now), _rank(2, 4, now - 70, wait)], now=now)
    assert (stalled.stalled, stalled.gone, stalled.healthy) == ([1], [], False)
    assert render_watch(stalled).splitlines()[-1].startswith("STALLED: rank 1 (no progress for 70 s; its last collective: all_reduce #8")

    idle = watch([_rank(0, 4, now - 70, heartbeat=now), _rank(1, 4, now - 70, heartbeat=now)], now=now)
    assert idle.healthy  # nobody waits for anybody: a long step, not a stall

    hung = watch([_rank(0, 4, now - 70, wait), _rank(1, 4, now - 70, wait)], now=now)
    assert hung.hung and "HUNG: every rank waits" in render_watch(hung)

    behind = watch([_rank(0, 40, now), _rank(1, 40, now), _rank(2, 30, now)], now=now)
    assert behind.stragglers == [2] and "STRAGGLING: rank 2 more than 10% behind the median step 40" in render_watch(behind)


def test_watch_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in ([str(tmp_path / "nope")], [str(tmp_path / "nope"), "--once"], [str(tmp_path), "--stall-after", "0"]):
        proc = subprocess.run([sys.executable, "-m", "commdebug", "watch", *args, "--once"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_a_rank_that_failed_or_vanished_after_the_others_finished_is_not_healthy():
    """The job is over: rank 0's dump says it ended by an error, rank 1 left only a stream that
    nobody touches any more (SIGKILL). `watch --once` must not call that healthy; ranks that
    ended well are."""
    now = 1000.0
    failed = _rank(0, 5, now - 30)
    failed.ended_by = "RuntimeError: Read error [127.0.0.1]:54660: Connection reset by peer. This is typically caused by a remote worker\nsecond line"
    killed = _rank(1, 4, now - 30)
    result = watch([failed, killed], now=now)
    assert (result.failed, result.gone, result.healthy) == ([0], [1], False)
    text = render_watch(result)
    assert "FAILED: rank 0 ended by RuntimeError: Read error" in text and "GONE: rank 1 stopped in step 4 without a final dump" in text
    assert "second line" not in text and "remote worker" not in text  # the error: its first line, cut short

    done = _rank(0, 5, now - 30)
    done.ended_by = "exit"
    still = _rank(1, 5, now - 2)  # finishing a moment later: alive
    assert watch([done, still], now=now).healthy


def test_ranks_waiting_apart_inside_stall_after_are_never_called_healthy():
    """Both ranks stuck 15 s at one seq in different calls (stall_after 60): a hang in the
    making, said at once; a wait in the same call is worded as waiting, not healthy."""
    now = 1000.0
    reduce = Call("all_reduce", "default_pg[2]", 4, "Global", "train.py:9", 2, True, now - 15)
    gather = Call("all_gather_into_tensor", "default_pg[2]", 4, "Global", "train.py:12", 2, True, now - 15)
    apart = watch([_rank(0, 2, now - 15, reduce), _rank(1, 2, now - 15, gather)], now=now)
    assert (apart.apart, apart.hung, apart.healthy) == ([0, 1], False, False)
    verdict = render_watch(apart).splitlines()[-1]
    assert verdict.startswith("WAITING APART: rank 0 waits 15 s in all_reduce #4 on default_pg[2] in Global at train.py:9; "
                              "rank 1 waits 15 s in all_gather_into_tensor #4"), verdict
    assert "healthy" not in render_watch(apart)
    assert apart.to_dict()["apart"] == [0, 1]

    same = watch([_rank(0, 2, now - 15, reduce), _rank(1, 2, now - 15, reduce)], now=now)
    assert (same.apart, same.hung, same.healthy) == ([], False, True)
    verdict = render_watch(same).splitlines()[-1]
    assert verdict.startswith("waiting: rank 0 waits 15 s in all_reduce #4") and "healthy" not in verdict, verdict

    other_groups = watch([_rank(0, 2, now - 15, reduce), _rank(1, 2, now - 15, Call("all_reduce", "mesh_dp[2]", 7, None, None, 2, True, now - 15))], now=now)
    assert other_groups.apart == []  # members of different groups wait in different calls by nature


def test_watch_waits_for_a_stream_with_no_whole_line_yet(tmp_path, world):
    from test_streaming import _events

    from commdebug.analysis.watch import job_started, watch_path
    from commdebug.model.stream import chunk_line, header_line

    assert not job_started(tmp_path / "traces")  # no folder yet
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank0.jsonl").write_text("")  # just created by its rank
    assert not job_started(traces)
    once = subprocess.run([sys.executable, "-m", "commdebug", "watch", str(traces), "--once"], capture_output=True, text=True, timeout=60)
    assert once.returncode == 2 and "no rank has streamed a whole line yet" in once.stderr, once.stderr
    meta = {"rank": 1, "world_size": 2, "backend": "gloo"}
    (traces / "rank1.jsonl").write_text(header_line(meta, 2, 1.0) + chunk_line(_events(world, 2), time=2.0, step=1, events_total=2))
    assert job_started(traces)
    result = watch_path(traces)
    assert [r.rank for r in result.ranks] == [1] and "no stream yet from rank 0" in result.notes
