"""How a rank ended when a native crash ended it (docs/ranks.md, "How each rank ended"): the
fault record a dying rank leaves beside its stream, and every verb naming the signal and the
program's line from it; a stream that lost its tail while its peer completed the later calls is
no "missing" call. Real two-rank gloo jobs under torchrun (tests/programs/live_job.py), a
one-rank program under `commdebug run` (tests/programs/faulty.py), and records written here."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from commdebug.analysis.check import check_path
from commdebug.launch.faults import AVAILABLE
from commdebug.model.fault import header_text

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "tests" / "programs" / "live_job.py"
FAULTY = ROOT / "tests" / "programs" / "faulty.py"
ABORT_LINE = next(i for i, line in enumerate(LIVE.read_text().splitlines(), 1) if "ABORT_LINE" in line)
FAULTY_LINE = next(i for i, line in enumerate(FAULTY.read_text().splitlines(), 1) if "ABORT_LINE" in line)
GRAD_LINE = next(i for i, line in enumerate(LIVE.read_text().splitlines(), 1) if "GRAD_ALL_REDUCE" in line)
DEADLINE_S = 120
BUILD = "commdebug.launch._faults was not built: pip install -e . (or python setup.py build_ext --inplace) with a C compiler"
# rank 0 is in the all_reduce of step 2 when rank 1 dies: gloo fails it (the connection is reset
# or closed), or torchrun's SIGTERM comes first and its dump shows it unfinished
MISSING = (r"\[missing\] group default_pg\[2\] seq 4: (rank 0 waits in it \(unfinished\); )?rank 1's record ends before "
           r"it \(whether it issued it is not known\)")
USUAL_CAUSES = ("its process ended without a final dump and the cause was not recorded (SIGKILL, the OOM killer, "
                "a lost node or a native crash are the usual ones)")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # this checkout's commdebug, from any working directory
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd or ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RANK", None)
    return env


@pytest.fixture(scope="module")
def aborted(tmp_path_factory) -> Path:
    """Two gloo ranks under `torchrun -m commdebug run`; rank 1 calls os.abort() as step 2 starts."""
    assert AVAILABLE, BUILD
    cwd = tmp_path_factory.mktemp("aborted")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--out", "traces", "--", str(LIVE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=DEADLINE_S,
                          env={**_env(), "LIVE_BAD": "abort", "LIVE_AT": "2", "LIVE_STEPS": "4"})
    assert proc.returncode != 0
    traces = cwd / "traces"
    assert (traces / "rank1.fault").is_file() and (traces / "rank1.jsonl").is_file(), proc.stderr[-3000:]
    assert not (traces / "rank1.json").exists() and not (traces / "rank0.fault").exists()
    return traces


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 120)
def test_an_aborted_rank_is_named_by_its_signal_and_line_in_check_report_watch_and_the_page(aborted, tmp_path):
    cause = f"SIGABRT (a native abort), main thread at {LIVE}:{ABORT_LINE} in <module>"
    check = cli("check", str(aborted))
    assert check.returncode == 1, check.stdout + check.stderr
    text = check.stdout
    assert f"  rank 1: ended by {cause}, without a final dump; only its stream is left: it stops in step 2" in text, text
    assert f"1. [ended] rank 1 ended by {cause}, without a final dump\n" in text, text
    # rank 1 never reached the all_reduce of step 2, but its stream may have lost its last
    # second: the data cannot say it never issued it
    assert "never issued" not in text and re.search(MISSING, text), text
    data = json.loads(cli("check", str(aborted), "--json").stdout)
    fault = data["rank_summaries"][1]["fault"]
    assert (fault["signal"], fault["signum"], fault["in_main_thread"]) == ("SIGABRT", 6, True)
    assert fault["main"][0] == {"file": str(LIVE), "line": ABORT_LINE, "function": "<module>"}
    assert [f["kind"] for f in data["findings"]][:1] == ["ended"] and not data["consistent"]

    report = cli("report", str(aborted))
    assert report.returncode == 0, report.stderr
    assert f"note: rank 1: ended by {cause}, without a final dump" in report.stdout, report.stdout

    watch = cli("watch", str(aborted), "--once")
    assert watch.returncode == 1, watch.stdout + watch.stderr
    assert f"FAILED: rank 1 ended by {cause}, without a final dump" in watch.stdout, watch.stdout
    # rank 0 failed on the lost connection (its message as check shows it, without gloo's C++
    # location), or torchrun's SIGTERM ended it first
    assert re.search(r"FAILED: rank 0 ended by (RuntimeError: (Read error|Connection closed)|SIGTERM)", watch.stdout), watch.stdout
    assert "pair.cc" not in watch.stdout and "[/__w" not in watch.stdout

    from visualizer import ranks_data

    index, _ = ranks_data(aborted)
    page_rank = index["ranks"][1]
    assert page_rank["meta"]["fault"]["words"] == cause
    assert f"ended by {cause}, without a final dump" in page_rank["notes"]
    assert page_rank["ending"].startswith(f"ended by {cause}, without a final dump; only its stream is left: it stops in step ")
    assert index["check"]["findings"][0]["message"] == data["findings"][0]["message"]

    for out in (check.stdout, report.stdout, watch.stdout, json.dumps(index)):
        assert "SIGKILL" not in out and "OOM" not in out  # the cause is recorded: no other is guessed


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 120)
def test_a_stream_that_lost_its_tail_is_known_from_the_peer_not_missing(aborted, tmp_path):
    # rank 1's stream as if its last second were lost: only its chunks up to seq 1 (step 0)
    # survive, while rank 0's dump shows seq 2-3 completed (all_reduces need every member). The
    # streamer flushes at step boundaries and every second besides, so how many chunks hold
    # step 0 depends on the machine's speed: cut after the one that completes seq 1
    cut = tmp_path / "cut"
    shutil.copytree(aborted, cut)
    lines = (cut / "rank1.jsonl").read_text().splitlines(keepends=True)
    seqs: list[int] = []
    kept = 1  # the header line
    while 1 not in seqs and kept < len(lines):
        seqs += [s for s in json.loads(lines[kept]).get("events", {}).get("columns", {}).get("seq", []) if s is not None]
        kept += 1
    assert sorted(seqs) == [0, 1] and kept < len(lines), seqs  # later chunks exist: they are what is lost
    (cut / "rank1.jsonl").write_text("".join(lines[:kept]))

    check = cli("check", str(cut))
    assert check.returncode == 1, check.stdout + check.stderr  # rank 1 crashed: the run failed
    text = check.stdout
    assert ("note: group default_pg[2]: rank 1's record stops at seq 1 (its last flushed chunk), but rank 0's record shows "
            "seq 2-3 completed, so rank 1 issued them: the calls after that are known from the other members' records") in text, text
    assert "seq 2:" not in text and "seq 3:" not in text  # no finding for the calls rank 0 completed
    # the call nobody completed (rank 0's failed on the lost connection, or was cut by SIGTERM) is
    # still a finding
    assert re.search("2. " + MISSING, text), text
    assert re.search(rf"rank 0: all_reduce 256 B float32 (\(unfinished\) )?in Global at {re.escape(str(LIVE))}:{GRAD_LINE}", text), text


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S)
def test_the_record_survives_a_faulthandler_enabled_later_which_still_writes_to_stderr(tmp_path):
    assert AVAILABLE, BUILD
    bare = subprocess.run([sys.executable, str(FAULTY), "after"], capture_output=True, text=True, cwd=tmp_path,
                          env=_env(), timeout=DEADLINE_S)
    run = subprocess.run([sys.executable, "-m", "commdebug", "run", "--out", "out", "--", str(FAULTY), "out/rank0.jsonl", "after"],
                         capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=DEADLINE_S)
    assert run.returncode == bare.returncode == -6  # the job dies of the same signal
    # the program's own faulthandler (enabled after commdebug's) still writes its stderr output
    for proc in (bare, run):
        assert "Fatal Python error: Aborted" in proc.stderr and f'File "{FAULTY}", line {FAULTY_LINE} in crash' in proc.stderr
    out = tmp_path / "out"
    header = json.loads((out / "rank0.jsonl").read_text().splitlines()[0])
    pid = header["metadata"]["pid"]
    # the rank was not known yet (no RANK, no step marked): the record is named by the pid
    assert sorted(p.name for p in out.iterdir()) == [f"pid{pid}.fault", "rank0.jsonl"]
    check = cli("check", str(out))
    assert check.returncode == 1
    assert f"[ended] rank 0 ended by SIGABRT (a native abort), main thread at {FAULTY}:{FAULTY_LINE} in crash, without a final dump" in check.stdout


@pytest.mark.proc
def test_a_stack_overflow_is_recorded_on_the_handlers_own_stack(tmp_path):
    """The C stack overflows in the main thread (no faulthandler, so no alternate stack of its
    own): the record is still written, and the job still dies of SIGSEGV."""
    assert AVAILABLE, BUILD
    line = next(i for i, text in enumerate(FAULTY.read_text().splitlines(), 1) if "OVERFLOW_LINE" in text)
    bare = subprocess.run([sys.executable, str(FAULTY), "overflow"], capture_output=True, text=True, cwd=tmp_path,
                          env=_env(), timeout=DEADLINE_S)
    run = subprocess.run([sys.executable, "-m", "commdebug", "run", "--out", "out", "--", str(FAULTY), "out/rank0.jsonl", "overflow"],
                         capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=DEADLINE_S)
    assert run.returncode == bare.returncode == -signal.SIGSEGV, run.stderr[-2000:]
    records = list((tmp_path / "out").glob("*.fault"))
    assert len(records) == 1, sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "signal: 11" in records[0].read_text()
    check = cli("check", str(tmp_path / "out"))
    assert f"[ended] rank 0 ended by SIGSEGV (a segmentation fault), main thread at {FAULTY}:{line} in crash" in check.stdout, check.stdout


# ---------------------------------------------------------------- records written here

def _record(pid: int, rank: int | None = 1, run_id: str | None = None, main: int = 0x7F00, thread: int | None = None,
            signum: int | None = 6, frames: str = '  File "/job/train.py", line 40 in train_step\n') -> str:
    text = header_text(rank, pid, run_id, main)
    if signum is None:
        return text
    thread = main if thread is None else thread
    stacks = f"Current thread 0x{thread:016x} (most recent call first):\n"
    if thread != main:
        stacks += f"  <no Python frame>\n\nThread 0x{main:016x} (most recent call first):\n"
    return text + f"signal: {signum}\nthread: 0x{thread:016x}\n\n" + stacks + frames + \
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 9 in main\n'


def _folder(tmp_path: Path, ended_by: dict[int, str] | None = None) -> Path:
    from synthetic import write_rank_dumps

    folder = tmp_path / "traces"
    write_rank_dumps(folder, ranks=2, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    for rank in (0, 1):
        f = folder / f"rank{rank}.json"
        dump = json.loads(f.read_text())
        dump["commdebug"]["metadata"]["run_id"] = "this-run"
        if rank in (ended_by or {}):
            dump["commdebug"]["metadata"]["ended_by"] = (ended_by or {})[rank]
        f.write_text(json.dumps(dump))
    return folder


def _pid(folder: Path, rank: int) -> int:
    return json.loads((folder / f"rank{rank}.json").read_text())["commdebug"]["metadata"]["pid"]


def test_a_record_of_another_process_or_without_a_signal_is_not_blamed(tmp_path):
    folder = _folder(tmp_path, {0: "exit", 1: "exit"})
    pid = _pid(folder, 1)
    for text in ("", "not a record\n", _record(pid, signum=None), _record(pid + 1), _record(pid, run_id="another-run")):
        (folder / "rank1.fault").write_text(text)
        result = check_path(folder)
        assert result.consistent and result.rank_summaries[1].fault is None, text
    (folder / "rank1.fault").unlink()
    (folder / f"pid{pid + 1}.fault").write_text(_record(pid + 1, rank=None))  # another process's, by name
    assert check_path(folder).rank_summaries[1].fault is None


@pytest.mark.proc
def test_an_abort_after_the_final_dump_is_a_note_on_a_complete_rank(tmp_path):
    folder = _folder(tmp_path, {0: "exit", 1: "exit"})
    (folder / "rank1.fault").write_text(_record(_pid(folder, 1)))
    check = cli("check", str(folder))
    assert check.returncode == 0, check.stdout  # the dump is complete: not a failure
    assert check.stdout.startswith("consistent: ")
    assert ("note: rank 1: died of SIGABRT (a native abort), main thread at /job/train.py:40 in train_step after its final "
            "dump was written, after the program's code ended: its dump is complete") in check.stdout
    assert "ranks 0-1: ended by exit; last " in check.stdout


def test_a_signal_in_another_thread_names_the_main_thread_and_says_where_it_came(tmp_path):
    folder = _folder(tmp_path, {0: "exit"})
    # rank 1 left a hang dump: a gloo worker thread aborted it later, with no Python frame
    f = folder / "rank1.json"
    dump = json.loads(f.read_text())
    dump["commdebug"]["metadata"]["ended_by"] = "hang"
    f.write_text(json.dumps(dump))
    (folder / "rank1.fault").write_text(_record(_pid(folder, 1), thread=0x7F11))
    result = check_path(folder)
    assert [f.kind for f in result.findings] == ["ended"]
    assert result.findings[0].message == ("rank 1 ended by SIGABRT (a native abort) in a thread running no Python code, "
                                          "main thread at /job/train.py:40 in train_step, without a final dump")


def test_a_stream_only_rank_without_a_record_is_not_given_a_cause(tmp_path):
    from commdebug.analysis.check_digest import RankSummary
    from commdebug.render.endings import rank_ending

    gone = RankSummary(1, "rank1.jsonl", None, "commdebug", 4, None, stream_step=3, stream_alive=False)
    elsewhere = RankSummary(1, "rank1.jsonl", None, "commdebug", 4, None, stream_step=3, stream_alive=None)
    assert rank_ending(gone) == f"{USUAL_CAUSES}; only its stream is left: it stops in step 3"
    assert rank_ending(elsewhere) == ("no final dump; only its stream is left: it stops in step 3 (it still runs, or "
                                      "its process ended and the cause was not recorded (SIGKILL, the OOM killer, a lost "
                                      "node or a native crash are the usual ones))")


def test_only_a_dump_not_a_stream_proves_a_call_completed(tmp_path, world):
    """A stream flags a call unfinished only once it has waited 2 s, so its unflagged calls prove
    nothing, even when its metadata still says a hang dump flagged them (metadata it carried on)."""
    import torch

    import commdebug
    from commdebug.model.stream import chunk_line, header_line

    mode = commdebug.CommDebugMode()
    with mode:
        for _ in range(6):
            torch.distributed.all_reduce(torch.ones(16))
    events = list(mode.trace.events)
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank, n, extra in ((0, 6, {"unfinished_marked": True}), (1, 4, {})):
        meta = {"rank": rank, "world_size": 2, "backend": "gloo", "pid": 1, "hostname": "another-node", **extra}
        (folder / f"rank{rank}.jsonl").write_text(header_line(meta, 2, 1.0) + chunk_line(events[:n], time=2.0, step=0, events_total=n))
    result = check_path(folder)
    assert [f.kind for f in result.findings] == ["missing"] and result.findings[0].seq == 4, result.findings
    assert not any("issued them" in n for n in result.notes), result.notes


@pytest.mark.parametrize("op", ["all_reduce", "broadcast"])
def test_a_finished_call_proves_the_others_issued_it_only_for_ops_that_need_every_member(tmp_path, world, op):
    """Rank 0's final dump shows 4 calls finished; rank 1's stream stops after 2. An all_reduce
    finishes on no member before every member issued it; a broadcast's root may finish alone."""
    import torch

    import commdebug
    from commdebug.model.dump import dump_text
    from commdebug.model.stream import chunk_line, header_line

    mode = commdebug.CommDebugMode()
    with mode:
        for _ in range(4):
            getattr(torch.distributed, op)(torch.ones(16), **({"src": 0} if op == "broadcast" else {}))
    folder = tmp_path / "traces"
    folder.mkdir()
    trace = mode.trace
    trace.metadata.update(rank=0, world_size=2, backend="gloo", pid=1, hostname="another-node", ended_by="exit",
                          unfinished_marked=True)
    (folder / "rank0.json").write_text(dump_text(trace))
    meta = {"rank": 1, "world_size": 2, "backend": "gloo", "pid": 2, "hostname": "another-node"}
    events = list(trace.events)[:2]
    (folder / "rank1.jsonl").write_text(header_line(meta, 2, 1.0) + chunk_line(events, time=2.0, step=0, events_total=2))
    result = check_path(folder)
    if op == "all_reduce":
        assert result.consistent, result.findings
        assert any("rank 1's record stops at seq 1 (its last flushed chunk), but rank 0's record shows seq 2-3 completed" in n
                   for n in result.notes), result.notes
    else:
        assert [(f.kind, f.seq) for f in result.findings] == [("missing", 2)]
        assert "rank 1's record ends before it" in result.findings[0].message
        assert not any("completed, so" in n for n in result.notes), result.notes
