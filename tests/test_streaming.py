"""Streaming (docs/streaming.md): each rank appends what it records to OUT/rank<R>.jsonl while
it runs. A rank killed with SIGKILL leaves its stream, which every verb reads; a torn last chunk
reads with one note; --keep-steps bounds the files of a long run and summary still counts
every collective. Real gloo jobs under torchrun (tests/programs/live_job.py), a fake-PG loop
under `commdebug run` (tests/programs/long_fake.py), and streams written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import commdebug
from commdebug.model.stream import chunk_line, header_line

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "tests" / "programs" / "live_job.py"
LONG = ROOT / "tests" / "programs" / "long_fake.py"
GRAD_LINE = next(i for i, line in enumerate(LIVE.read_text().splitlines(), 1) if "GRAD_ALL_REDUCE" in line)
DEADLINE_S = 120


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=120)


def torchrun_live(cwd: Path, env: dict[str, str], *options: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--out", "traces", *options, "--", str(LIVE)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=full_env, timeout=DEADLINE_S)


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_rank_killed_with_sigkill_leaves_its_stream_and_check_names_it(tmp_path):
    proc = torchrun_live(tmp_path, {"LIVE_BAD": "kill", "LIVE_AT": "3", "LIVE_STEPS": "6"})
    assert proc.returncode != 0
    traces = tmp_path / "traces"
    # rank 0 ended (its peer vanished) and wrote its dump; rank 1 left only its stream
    assert (traces / "rank0.json").is_file() and not (traces / "rank0.jsonl").exists()
    assert (traces / "rank1.jsonl").is_file() and not (traces / "rank1.json").exists(), proc.stderr[-3000:]

    summary = cli("summary", str(traces), "--rank", "1", "--by", "step", "--json")
    assert summary.returncode == 0, summary.stderr
    rows = {r["step"]: r["calls"] for r in json.loads(summary.stdout)["rows"]}
    assert rows == {0: 2, 1: 2, 2: 2}  # weight and bias all_reduce per step, steps 0-2 complete

    check = cli("check", str(traces))
    assert check.returncode == 1, check.stdout + check.stderr
    text = check.stdout
    # SIGKILL leaves no record: no cause is named as fact, the usual ones are listed
    usual = "the cause was not recorded (SIGKILL, the OOM killer, a lost node or a native crash are the usual ones)"
    assert (f"  rank 1: its process ended without a final dump and {usual}; only its stream is left: it stops in step 3, "
            "its last collective in step 2") in text, text
    assert f"1. [ended] rank 1: its process ended without a final dump and {usual}\n" in text
    assert f"last all_reduce #5 on default_pg[2] at {LIVE}:{GRAD_LINE}" in text
    # what rank 0 was in when rank 1 vanished: the first all_reduce of step 3, which a stream
    # without a final dump cannot say rank 1 never issued
    assert "[missing] group default_pg[2] seq 6: rank 1's record ends before it (whether it issued it is not known)" in text
    assert f"rank 0: all_reduce 256 B float32 in Global at {LIVE}:{GRAD_LINE}" in text
    assert "rank1.fault" not in {p.name for p in traces.iterdir()}  # no fatal signal, no record

    for verb in ("report", "trace", "view"):  # every folder verb reads what rank 1 wrote so far
        out = cli(verb, str(traces), *(["-o", str(tmp_path / f"{verb}.out")] if verb != "report" else []))
        assert out.returncode == 0, (verb, out.stdout, out.stderr)
    watch = cli("watch", str(traces), "--once", "--json")
    assert watch.returncode in (0, 1) and {r["rank"] for r in json.loads(watch.stdout)["ranks"]} == {0, 1}


def _events(world: int, n: int) -> list:
    """`n` recorded all_reduces of a fake world, steps of 2."""
    mode = commdebug.CommDebugMode()
    with mode:
        for i in range(n):
            torch.distributed.all_reduce(torch.ones(16))
            if i % 2:
                mode.step()
    return list(mode.trace.events)


@pytest.mark.proc
def test_a_torn_last_chunk_reads_up_to_it_with_one_note(tmp_path, world):
    events = _events(world, 6)
    meta = {"rank": 1, "world_size": world, "backend": "fake", "hostname": "h", "run_id": "r1"}
    whole = header_line(meta, 2, 1.0) + chunk_line(events[:4], time=2.0, step=2, events_total=4) + chunk_line(events[4:], time=3.0, step=3, events_total=6)
    stream = tmp_path / "rank1.jsonl"
    stream.write_text(whole[: len(whole) - 25])  # killed in the middle of writing the last chunk

    trace = commdebug.load(stream)
    assert [e.index for e in trace.events] == [0, 1, 2, 3]
    assert trace.metadata["read_notes"] == ["its stream's last chunk was cut short (its process ended while writing it): read up to it"]
    summary = cli("summary", str(stream), "--by", "op")
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.count("cut short") == 1 and "all_reduce" in summary.stdout
    check = cli("check", str(tmp_path))
    # the other 7 ranks left nothing here and no dump places them on this host: not in this folder
    assert check.returncode == 0 and check.stdout.startswith("consistent among rank 1 of 8:"), check.stdout
    assert check.stdout.count("cut short") == 1
    # a bad line before the last one is a malformed file: one line, exit 2
    stream.write_text(whole.replace('"kind":"chunk"', '"kind":"chunk",,', 1))
    bad = cli("summary", str(stream))
    assert bad.returncode == 2 and bad.stderr.startswith(f"commdebug: error: {stream}: line 2 of the stream is not valid JSON")


def test_a_hang_dump_wins_over_its_live_stream_until_the_stream_shows_progress(tmp_path, world):
    from commdebug.formats.readers import job_files
    from commdebug.model.dump import dump_text

    events = _events(world, 4)
    meta = {"rank": 0, "world_size": 1, "backend": "fake"}
    mode = commdebug.CommDebugMode()
    dump, stream = tmp_path / "rank0.json", tmp_path / "rank0.jsonl"

    def write(ended_by: str, progress: float) -> None:
        mode.trace.metadata["ended_by"] = ended_by
        dump.write_text(dump_text(mode.trace))
        stream.write_text(header_line(meta, 2, 1.0) + chunk_line(events, time=progress, step=2, events_total=4, progress=progress))
        os.utime(dump, (100, 100))
        os.utime(stream, (200, 200))  # the stream is touched while its rank lives, hung or not

    write("hang", progress=50.0)  # the watchdog's dump came after the rank's last progress: it is hung
    assert job_files(tmp_path) == [dump]
    assert job_files(tmp_path, live=True) == [stream]  # watch reads heartbeats and waiting times
    write("hang", progress=150.0)  # new collectives after the hang dump: the hang is over
    assert job_files(tmp_path) == [stream]
    write("exit", progress=150.0)  # a final dump holds all its stream held, whatever the file times
    assert job_files(tmp_path) == [dump]


def test_a_flush_after_the_stream_closed_does_not_write_it_again(tmp_path, world):
    """A step-boundary flush that waited for close() (SIGTERM ends the run as the training thread
    reaches optimizer.step()) used to open the stream again: a file newer than the final dump,
    read in its place, holding only the last chunk."""
    from commdebug.launch.stream import Streamer

    mode = commdebug.CommDebugMode()
    with mode:
        torch.distributed.all_reduce(torch.ones(16))
        streamer = Streamer(mode, tmp_path, rank_of=lambda meta: 0)
        assert streamer.flush() == 1
        stream = streamer.path
        assert stream is not None and stream.exists()
        streamer.close(remove=True)
        assert not stream.exists()
        torch.distributed.all_reduce(torch.ones(16))
        mode.step()
        assert streamer.flush(boundary=True) == 0
    assert not stream.exists()


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S)
def test_keep_steps_bounds_a_3000_step_run_and_summary_counts_every_collective(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "commdebug", "run", "--light", "--keep-steps", "50", "--out", "traces", "--",
                           str(LONG), "3000", "traces/rank0.jsonl"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    largest = int(proc.stdout.split("largest stream: ")[1])
    dump = tmp_path / "traces" / "rank0.json"
    assert 0 < largest < 3 * 2**20 and dump.stat().st_size < 3 * 2**20
    summary = json.loads(cli("summary", str(dump), "--by", "op", "--json").stdout)
    assert summary["header"]["collectives"] == 30_000 and summary["header"]["steps"] == 3000
    (row,) = summary["rows"]
    assert (row["op"], row["calls"], row["bytes"]) == ("all_reduce", 30_000, 30_000 * 1024)
    steps = json.loads(cli("summary", str(dump), "--by", "step", "--json").stdout)["rows"]
    assert len(steps) == 3000 and all(r["calls"] == 10 for r in steps)
    # raw events of the last 50 steps only
    trace = commdebug.load(dump)
    assert {e.step for e in trace.events} == set(range(2950, 3000))


@pytest.mark.proc
def test_check_says_whether_a_stream_only_rank_still_runs_where_it_can_know(tmp_path, world):
    """A rank with only a stream is either still running or its process ended; on the host that
    wrote the stream, its pid says which (a file's times cannot: a rank killed a second ago looks
    alive), never why it ended."""
    import socket

    from commdebug.analysis.check import check_path
    from commdebug.render.check import render_check

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    events = _events(world, 2)
    lines = {}
    for name, pid, host in (("alive", os.getpid(), socket.gethostname()), ("dead", int(dead), socket.gethostname()),
                            ("elsewhere", os.getpid(), "another-node")):
        meta = {"rank": 0, "world_size": 1, "backend": "fake", "pid": pid, "hostname": host}
        stream = tmp_path / name / "rank0.jsonl"
        stream.parent.mkdir()
        stream.write_text(header_line(meta, 2, 1.0) + chunk_line(events, time=2.0, step=1, events_total=2))
        lines[name] = next(line for line in render_check(check_path(stream.parent)).splitlines() if line.startswith("  rank 0:"))
    assert lines["alive"].startswith("  rank 0: still running: no final dump yet; its stream says step 1"), lines
    # no cause named as fact: without a fault record it was not recorded
    usual = "the cause was not recorded (SIGKILL, the OOM killer, a lost node or a native crash are the usual ones)"
    assert lines["dead"].startswith(f"  rank 0: its process ended without a final dump and {usual}; only its stream is left: "
                                    "it stops in step 1"), lines
    assert lines["elsewhere"].startswith("  rank 0: no final dump; only its stream is left: it stops in step 1, its last "
                                         f"collective in step 0 (it still runs, or its process ended and {usual})"), lines
