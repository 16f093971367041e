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
from ports import free_port  # noqa: E402  (the one way to find free ports: bench/ports.py)

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


@pytest.mark.proc
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
        rank0 = r'\{host="[^"]+",rank="0"\}'  # every series says whose it is
        assert re.search(rf"^commdebug_step{rank0} 2\.0$", text, re.M) and re.search(rf"^commdebug_collectives_in_flight{rank0} 1\.0$", text, re.M)

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


@pytest.mark.proc
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
    assert "FAILED: rank 0 ended by RuntimeError: Read error" in text
    # the other rank failed: it never "finished", and the wording says which did what
    assert "GONE: rank 1 stopped in step 4: no final dump and no sign of life for 30 s since rank 0 failed" in text, text
    assert "finished" not in text, text
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


@pytest.mark.proc
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


# ---------------------------------------------------------------- the step, and the end of the job

def _final(folder: Path, rank: int, *, ended_by: str = "exit", run_id: str = "run-b", step: int | None = 2,
           world: int = 2) -> Path:
    """rank<rank>.json: a final dump whose calls go up to step 2 (``metadata.steps`` 3, a count),
    ended by `ended_by`; `step` None: written before ``metadata.step`` existed."""
    from synthetic import transformer_dump

    dump = transformer_dump(1, 3, world_size=world, rank=rank)
    meta = dump["commdebug"]["metadata"]
    meta.update(ended_by=ended_by, run_id=run_id, steps=3)
    if step is not None:
        meta["step"] = step
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.json"
    path.write_text(json.dumps(dump))
    return path


def _watch(folder: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "commdebug", "watch", str(folder), "--interval", "0.2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_the_step_of_a_rank_with_a_final_dump_is_the_step_it_ended_in(tmp_path):
    """Rank 0 hung in step 2 (its dump: ``steps`` 3, ``step`` 2), rank 1 a dump of before
    ``step`` existed: both read step 2, and the median step is known."""
    from commdebug.analysis.watch import watch_path

    _final(tmp_path, 0, ended_by="RuntimeError: timed out", step=2)
    _final(tmp_path, 1, step=None)
    result = watch_path(tmp_path)
    assert [r.step for r in result.ranks] == [2, 2] and result.median_step == 2
    text = render_watch(result)
    assert re.search(r"median step 2, ", text.splitlines()[0]), text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:4]}
    assert rows["0"][1] == "2" and rows["1"][1] == "2", text


@pytest.mark.proc
def test_watch_exits_once_every_rank_has_ended(tmp_path):
    """Every rank's final dump is there: watch prints the frame and exits, 0 when every rank
    ended well, 1 when one failed; --follow keeps refreshing."""
    ok = tmp_path / "ok"
    for r in (0, 1):
        _final(ok, r)
    proc = _watch(ok)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "the run is over: every rank has ended" in out and out.rstrip().endswith("healthy, 2 finished"), out

    failed = tmp_path / "failed"
    _final(failed, 0)
    _final(failed, 1, ended_by="RuntimeError: Connection reset by peer")
    proc = _watch(failed)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "FAILED: rank 1 ended by RuntimeError: Connection reset by peer" in out, out

    follow = _watch(ok, "--follow")
    try:
        frames, deadline = 0, time.monotonic() + 60
        while frames < 3 and time.monotonic() < deadline:  # frames keep coming after the run is over
            line = follow.stdout.readline()
            frames += line.startswith("commdebug watch ")
        assert frames == 3 and follow.poll() is None
    finally:
        follow.kill()
        follow.communicate(timeout=30)


@pytest.mark.proc
def test_watch_ends_on_a_rank_whose_process_is_gone_and_counts_only_the_newest_run(tmp_path, world):
    """Rank 0 finished; rank 1 left a stream whose process (on this host) has ended, without a
    final dump: the run is over, not healthy. Ranks 2-3's dumps are an earlier run's (another
    run id, older files): left out, and said."""
    import socket

    from test_streaming import _events

    from commdebug.model.stream import chunk_line, header_line

    folder = tmp_path / "traces"
    for r in (2, 3):  # the earlier launch, 4 ranks
        old = _final(folder, r, run_id="run-a", world=4)
        os.utime(old, (time.time() - 3600, time.time() - 3600))
    _final(folder, 0)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    meta = {"rank": 1, "world_size": 2, "backend": "gloo", "hostname": socket.gethostname(), "pid": int(dead.stdout), "run_id": "run-b"}
    (folder / "rank1.jsonl").write_text(header_line(meta, 2, time.time()) + chunk_line(_events(world, 4), time=time.time(), step=1, events_total=4))
    proc = _watch(folder)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert out.startswith(f"\ncommdebug watch {folder}: 2 ranks, median step 1.5, ") and "the run is over" in out, out
    # this host's kernel says its process ended: said as the fact it is (check says the same)
    assert "GONE: rank 1 stopped in step 1: its process has ended, without a final dump" in out, out
    assert "note: left out 2 files of an earlier run: rank2.json, rank3.json" in out, out


def test_a_recording_that_ends_in_step_2_says_so_and_watch_reads_it(tmp_path, world):
    """A real recording (fake backend) whose calls reach step 2 and that ends there: its dump's
    ``steps`` is 3 (a count) and ``step`` 2, and watch shows 2."""
    import torch

    import commdebug
    from commdebug.analysis.watch import watch_path

    mode = commdebug.CommDebugMode()
    with mode:
        for step in range(3):
            torch.distributed.all_reduce(torch.ones(16))
            if step < 2:
                mode.step()
    mode.trace.metadata["ended_by"] = "RuntimeError: stuck in step 2"
    path = tmp_path / "rank0.json"
    mode.generate_json_dump(str(path))
    meta = json.loads(path.read_text())["commdebug"]["metadata"]
    assert (meta["steps"], meta["step"]) == (3, 2)
    assert [r.step for r in watch_path(tmp_path).ranks] == [2]


def test_the_header_median_counts_finished_ranks_and_a_rank_finishing_last_is_no_straggler():
    now = 1000.0
    done = []
    for r in range(3):
        d = _rank(r, 5, now - 1)
        d.ended_by = "exit"
        done.append(d)
    result = watch([*done, _rank(3, 4, now - 1)], now=now)  # its last step, the others finished
    assert (result.median_step, result.running_median_step, result.stragglers, result.healthy) == (5, 4, [], True)
    assert render_watch(result).startswith("commdebug watch: 4 ranks, median step 5, ")
    behind = watch([*done, _rank(3, 1, now - 1), _rank(4, 4, now - 1), _rank(5, 4, now - 1)], now=now)
    assert behind.stragglers == [3]
    assert "STRAGGLING: rank 3 more than 10% behind the median step 4 of the ranks still running" in render_watch(behind)
