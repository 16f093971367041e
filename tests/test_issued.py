"""Nothing recorded is lost (docs/streaming.md): each collective is written to the rank's stream
as it is issued, so a process killed right after issuing a call keeps it. Two real jobs, each run
once in a module-scoped fixture (tests/programs/issued_job.py): a rank that SIGKILLs itself after
an ``async_op=True`` all_reduce, and two gloo ranks whose uneven all_to_all makes gloo abort one of
them inside the call. Then the streamer and the reader in process, on the fake backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import commdebug
from commdebug.errors import DumpError
from commdebug.launch import stream as stream_module
from commdebug.launch.stream import Streamer
from commdebug.model.stream import chunk_line, header_line, issued_line, parse_stream

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "issued_job.py"
DEADLINE_S = 150


def _marked(marker: str) -> int:
    """The line of the job marked with ``marker``."""
    return next(number for number, text in enumerate(JOB.read_text().splitlines(), 1) if marker in text)


ASYNC_LINE, A2A_LINE, UNMATCHED_LINE = _marked("ASYNC_ALL_REDUCE"), _marked("UNEVEN_ALL_TO_ALL"), _marked("UNMATCHED_ALL_REDUCE")


def _env(bad: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ISSUED_BAD": bad}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """One gloo rank under `commdebug run --light` that SIGKILLs itself right after issuing an
    all_reduce with async_op=True, in its second step."""
    cwd = tmp_path_factory.mktemp("killed")
    proc = subprocess.run([sys.executable, "-m", "commdebug", "run", "--light", "--out", "traces", "--", str(JOB)],
                          capture_output=True, text=True, cwd=cwd, env=_env("kill"), timeout=DEADLINE_S)
    assert proc.returncode == -9, proc.stderr[-3000:]
    return cwd / "traces"


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """Two gloo ranks under torchrun and `commdebug run --light`; gloo aborts rank 0 inside an
    all_to_all whose splits disagree."""
    cwd = tmp_path_factory.mktemp("uneven")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--light", "--out", "traces", "--", str(JOB)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env("uneven"), timeout=DEADLINE_S)
    assert proc.returncode != 0
    traces = cwd / "traces"
    # gloo's own words, then the abort: rank 0 leaves its stream and its fault record, no dump
    assert "Received data size doesn't match expected size" in proc.stderr, proc.stderr[-3000:]
    assert (traces / "rank0.jsonl").is_file() and (traces / "rank0.fault").is_file(), proc.stderr[-3000:]
    assert not (traces / "rank0.json").exists()
    return traces


@pytest.fixture(scope="module")
def unmatched(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """Two gloo ranks under torchrun and `commdebug run --light --timing` (auto: CPU calls);
    rank 1 issues an all_reduce with async_op=True that rank 0 never issues, then SIGKILLs
    itself."""
    cwd = tmp_path_factory.mktemp("unmatched")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--light", "--timing", "--out", "traces", "--", str(JOB)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env("unmatched"), timeout=DEADLINE_S)
    return proc, cwd / "traces"


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_timing_waits_for_no_call_the_program_does_not_wait_for_so_a_rank_dies_as_it_would_without_us(unmatched):
    # Waiting for rank 1's unmatched async call (timing="sync") would hold it there, short of
    # its own SIGKILL, and the job would hang or fail some other way: it must die as without
    # commdebug, and its stream keep the call
    proc, traces = unmatched
    assert proc.returncode != 0
    assert "exitcode  : -9" in proc.stderr and "local_rank: 1" in proc.stderr, proc.stderr[-3000:]
    lost = commdebug.load(traces / "rank1.jsonl")
    last = lost.events[-1]
    assert (last.op, last.step, last.input_bytes, last.source) == ("all_reduce", 1, 64, f"{JOB}:{UNMATCHED_LINE}")
    assert last.latency_s is None  # never waited for: no time, not a guessed one
    # the gradients' blocking all_reduces are timed by waiting, as they wait anyway (those of
    # step 1 in rank 1's stream too, but the SIGKILL came before the stream wrote their times)
    survivor = commdebug.load(traces / "rank0.json")
    assert survivor.metadata["timing"] == "sync"
    assert [e.latency_s is not None for e in survivor.events] == [True] * 4 + [False]  # its step-2 call failed
    assert all(e.latency_s is not None for e in lost.events if e.step == 0)
    check = cli("check", str(traces))
    assert check.returncode == 1
    assert f"last all_reduce #4 on default_pg[2] at {JOB}:{UNMATCHED_LINE}" in check.stdout, check.stdout


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_rank_killed_right_after_issuing_an_async_collective_keeps_it_and_its_step(killed):
    assert [p.name for p in killed.iterdir()] == ["rank0.jsonl"]  # SIGKILL: no dump, no fault record
    trace = commdebug.load(killed / "rank0.jsonl")
    calls = [(e.step, e.op, e.seq, e.input_bytes) for e in trace.events]
    # step 0's two gradients; step 1's two, then the async all_reduce it never waited for
    assert calls == [(0, "all_reduce", 0, 256), (0, "all_reduce", 1, 32), (1, "all_reduce", 2, 256), (1, "all_reduce", 3, 32),
                     (1, "all_reduce", 4, 64)]
    assert trace.events[-1].source == f"{JOB}:{ASYNC_LINE}"
    check = cli("check", str(killed))
    assert check.returncode == 1, check.stdout + check.stderr
    assert f"it stops in step 1, its last collective in step 1; last all_reduce #4 on default_pg[1] at {JOB}:{ASYNC_LINE}" in check.stdout


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_rank_gloo_aborts_inside_an_uneven_all_to_all_leaves_the_call_and_check_names_the_mismatch(uneven):
    trace = commdebug.load(uneven / "rank0.jsonl")
    last = trace.events[-1]
    assert (last.op, last.seq, last.step, last.source) == ("all_to_all", 4, 1, f"{JOB}:{A2A_LINE}")
    assert (last.send_splits, last.recv_splits) == ((16, 16), (16, 16))  # 4 floats to and from each
    check = cli("check", str(uneven), "--json")
    assert check.returncode == 1, check.stderr
    findings = json.loads(check.stdout)["findings"]
    mismatch = next(f for f in findings if f["kind"] == "all_to_all")
    assert (mismatch["group"], mismatch["seq"], mismatch["step"]) == ("default_pg[2]", 4, 1)
    assert mismatch["message"] == "group default_pg[2] seq 4: rank 1 sends 24 B to rank 0, but rank 0 receives 16 B from rank 1"
    # rank 0's record holds the call itself: nothing to infer about it (rank 1 may have gone on
    # to its next call, which rank 0 never reached)
    assert not any(f["seq"] == 4 and f["kind"] != "all_to_all" for f in findings)
    text = cli("check", str(uneven)).stdout
    assert f"its last collective in step 1; last all_to_all #4 on default_pg[2] at {JOB}:{A2A_LINE}" in text


def _stream_of(streamer: Streamer) -> list[tuple[int, str, int | None]]:
    assert streamer.path is not None
    content = parse_stream(streamer.path.read_bytes(), str(streamer.path))
    return [(e.index, e.op, e.seq) for e in content.events]


def test_each_call_is_in_the_stream_before_any_flush_and_compaction_keeps_only_what_no_chunk_holds(tmp_path, world, monkeypatch):
    mode = commdebug.CommDebugMode(light=True)
    with mode:
        streamer = Streamer(mode, tmp_path, rank_of=lambda meta: 3, interval=3600).start()  # no background flush
        try:
            for _ in range(3):
                torch.distributed.all_reduce(torch.ones(4))
            # the first collective opened the file; each call is there with no flush
            assert _stream_of(streamer) == [(0, "all_reduce", 0), (1, "all_reduce", 1), (2, "all_reduce", 2)]
            raw = streamer.path.read_text()
            assert raw.count('"kind":"issued"') == 3 and raw.count('"groups"') == 1  # the group's members said once
            assert streamer.flush() == 3
            torch.distributed.broadcast(torch.ones(2), src=0)
            # compaction drops the issued lines of the chunked calls, keeps the broadcast's
            monkeypatch.setattr(stream_module, "COMPACT_BYTES", 0)
            streamer._compact()
            raw = streamer.path.read_text()
            assert raw.count('"kind":"issued"') == 1 and raw.count('"kind":"chunk"') == 1
            content = parse_stream(streamer.path.read_bytes(), "s")
            assert [(e.index, e.op) for e in content.events] == [(0, "all_reduce"), (1, "all_reduce"), (2, "all_reduce"), (3, "broadcast")]
            assert content.groups[content.events[-1].group.name].size == 8  # the tail line names its group anew
            torch.distributed.all_reduce(torch.ones(4))  # written to the compacted file, after its tail
            assert [i for i, _, _ in _stream_of(streamer)] == [0, 1, 2, 3, 4]
        finally:
            streamer.close(remove=False)


@pytest.mark.parametrize("light", [True, False])
def test_an_eager_call_is_in_the_stream_before_it_runs(tmp_path, world, light):
    """What a process that dies inside a collective leaves (gloo aborting in native code while
    the call runs, as in the uneven job above, where it lost the call whenever the abort came
    before the call returned): the call's line is written before the collective runs. The
    collective's own kernel is replaced, for this test, by one that reads the stream as an
    abort would leave it."""
    found: list = []

    def kernel(tensors, *rest):
        found.append(_stream_of(streamer))
        done = torch.futures.Future()
        done.set_result(tensors)
        return tensors, torch._C._distributed_c10d._create_work_from_future(done).boxed()

    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": ours, for this test
        library.impl("allreduce_", kernel, "CPU")
    try:
        with commdebug.CommDebugMode(light=light) as mode:
            streamer = Streamer(mode, tmp_path, rank_of=lambda meta: 0, interval=3600).start()
            try:
                torch.distributed.all_reduce(torch.ones(4))
            finally:
                streamer.close(remove=False)
    finally:
        library._destroy()
    assert found == [[(0, "all_reduce", 0)]]
    assert [(e.op, e.seq) for e in mode.trace.events] == [("all_reduce", 0)]  # recorded once


def test_a_keep_steps_rewrite_keeps_the_calls_no_chunk_holds(tmp_path, world):
    mode = commdebug.CommDebugMode(light=True)
    with mode:
        streamer = Streamer(mode, tmp_path, rank_of=lambda meta: 0, keep_steps=1, interval=3600).start()
        try:
            for _ in range(4):
                torch.distributed.all_reduce(torch.ones(4))
                mode.step()  # a boundary flush: the file is rewritten every other step
            torch.distributed.all_reduce(torch.ones(4))
            streamer._rewrite(mode.trace.metadata, cutoff=3)
            content = parse_stream(streamer.path.read_bytes(), "s")
            assert [e.index for e in content.events] == [3, 4]  # the last step kept, and the call issued since
            torch.distributed.all_reduce(torch.ones(4))
            assert [i for i, _, _ in _stream_of(streamer)] == [3, 4, 5]
        finally:
            streamer.close(remove=False)


def test_a_chunk_wins_over_an_issued_line_and_a_bad_row_names_its_line(tmp_path, world):
    mode = commdebug.CommDebugMode()
    with mode:
        for _ in range(3):
            torch.distributed.all_reduce(torch.ones(4))
    a, b, c = mode.trace.events
    group = a.group
    meta = {"rank": 0, "world_size": 8, "backend": "fake"}
    failed = b._replace(error="RuntimeError: gone")  # the chunk's later word on call 1
    text = (header_line(meta, 2, 1.0) + issued_line(a, 2.0, group) + issued_line(b, 2.5)
            + chunk_line([a, failed], time=3.0, step=0, events_total=2) + issued_line(c, 4.0))
    content = parse_stream(text.encode(), "s")
    assert [(e.index, e.error) for e in content.events] == [(0, None), (1, "RuntimeError: gone"), (2, None)]
    assert content.events[2] == c  # every field as recorded
    assert (content.events_total, content.progress, content.time) == (3, 4.0, 4.0)
    bad = text.replace('"event":[2,', '"event":["x",', 1)
    with pytest.raises(DumpError, match="line 5 of the stream is malformed"):
        parse_stream(bad.encode(), "s")
