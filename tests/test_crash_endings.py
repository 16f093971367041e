"""How a crashed rank's ending is told, and that every verb tells it alike (docs/ranks.md, "How
each rank ended"): a rank that timed out in a call never reached the next one (it did not skip
it); a rank that died of a signal died in the call its fault record's line and its peer's
record name; a Python exception names the program's line that raised it; a gone rank's words
name what is known; a collective's error carries no frame of commdebug.

One real two-rank gloo job under torchrun (the ``skip`` mode of tests/programs/crash_job.py, in a
module-scoped fixture); the other crashes are read from their recorded folders in
tests/data/crash_gloo/ (its README says how they were made)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commdebug.analysis.check import check_path
from commdebug.analysis.report import report_path
from commdebug.analysis.watch import watch_path
from commdebug.render.check import render_check
from commdebug.render.report import render_report
from commdebug.render.watch import render_watch

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "crash_job.py"
DATA = ROOT / "tests" / "data" / "crash_gloo"
PROGRAM = "tests/programs/crash_job.py"  # as the recorded folders name it
LINES = {mark: i for i, line in enumerate(JOB.read_text().splitlines(), 1) for mark in
         ("RAISE_LINE", "A2A_LINE", "ALL_REDUCE_LINE", "ALL_GATHER_LINE", "BARRIER_LINE") if f"# {mark}" in line}
DEADLINE_S = 120


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CRASH_MODE": "skip"}
    env.pop("RANK", None)
    return env


@pytest.fixture(scope="module")
def skipped(tmp_path_factory) -> tuple[Path, str]:
    """Rank 1 skips the all_reduce of step 2: both ranks time out (6 s), each in its own call."""
    cwd = tmp_path_factory.mktemp("skip")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "commdebug", "run", "--out", "traces", "--", str(JOB)],
                          capture_output=True, text=True, cwd=cwd, env=_env(), timeout=DEADLINE_S)
    assert proc.returncode != 0 and (cwd / "traces" / "rank1.json").is_file(), proc.stderr[-3000:]
    return cwd / "traces", proc.stderr


def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder, copy_function=shutil.copy)  # files touched now, as if just written
    return folder


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_rank_that_timed_out_in_its_call_never_reached_the_next_it_did_not_skip_it(skipped):
    folder, _ = skipped
    text = render_check(check_path(folder))
    at = f"{JOB}:"
    assert (f"rank 1 departed from its own earlier steps: in step 2 it skipped the call at {at}{LINES['ALL_REDUCE_LINE']} (Global) "
            f"and never reached the call at {at}{LINES['BARRIER_LINE']} (Global), its record ending before it") in text, text
    assert f"skipped the call at {at}{LINES['BARRIER_LINE']}" not in text, text


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_collectives_error_carries_no_frame_of_commdebug_and_its_ending_names_the_programs_line(skipped):
    folder, stderr = skipped
    # each rank's RuntimeError is printed as python prints it: torch's frames, then gloo's error
    assert stderr.count("RuntimeError: ") >= 1 and "distributed_c10d.py" in stderr, stderr[-3000:]
    assert "commdebug/capture" not in stderr and "inflight.py" not in stderr, stderr[-3000:]
    endings = {s.rank: s for s in check_path(folder).rank_summaries}
    # the call each rank's error came out of: the program's own line in the traceback
    assert endings[0].raised_at == {"file": str(JOB), "line": LINES["ALL_REDUCE_LINE"], "function": "main"}
    assert endings[1].raised_at == {"file": str(JOB), "line": LINES["ALL_GATHER_LINE"], "function": "main"}
    assert re.search(rf"rank 1: ended by RuntimeError: .*, at {re.escape(str(JOB))}:{LINES['ALL_GATHER_LINE']} in main; ",
                     render_check(check_path(folder))), render_check(check_path(folder))


def test_a_rank_that_died_of_a_signal_died_in_the_call_its_fault_record_and_its_peer_name(tmp_path):
    folder = _copy("abort", tmp_path)
    died = f"all_to_all #4 on default_pg[2] at {PROGRAM}:{LINES['A2A_LINE']}, the call it died in (its fault record's line; " \
           "rank 1's record shows it completed)"
    text = render_check(check_path(folder))
    line = next(ln for ln in text.splitlines() if ln.startswith("  rank 0: "))
    # its own stream stops at barrier #3 (step 0): the peer's record and its fault record say more
    assert line.endswith(f"; last {died}"), line
    assert ", its last collective in step 1;" in line and "barrier #3" not in line, line
    assert "rank 0 issued it: the calls after that are known from the other members' records" in text  # the note agrees

    data = json.loads(json.dumps(check_path(folder).to_dict()))
    rank0 = data["rank_summaries"][0]["died_in"]
    assert (rank0["op"], rank0["seq"], rank0["completed_by"], rank0["fault_line"]) == ("all_to_all", 4, 1, True)

    watched = render_watch(watch_path(folder))
    assert "FAILED: rank 0 ended by SIGABRT" in watched and f"without a final dump; last {died}" in watched, watched
    assert "its last collective: barrier #3" not in watched, watched

    from visualizer import ranks_data

    index, _ = ranks_data(folder)
    assert index["ranks"][0]["ending"].endswith(f"; last {died}")


def test_a_python_exception_names_the_line_that_raised_it_in_every_verb(tmp_path):
    folder = _copy("exception", tmp_path)
    said = f"ValueError: bad batch on rank 1 at step 2, at {PROGRAM}:{LINES['RAISE_LINE']} in load_batch"
    assert f"rank 1: ended by {said}; last barrier #5" in render_check(check_path(folder))
    assert f"FAILED: rank 1 ended by {said};" in render_watch(watch_path(folder))
    from visualizer import ranks_data

    index, _ = ranks_data(folder)
    assert index["ranks"][1]["ending"] == f"ended by {said}"


@pytest.mark.proc  # a process that has ended gives the dead pid
def test_a_gone_rank_is_told_by_what_is_known_and_report_says_what_check_says(tmp_path):
    folder = _copy("kill", tmp_path)
    # recorded on another host: whether its process still runs is not known here; its file was
    # last touched 15 s ago (watch calls a rank gone after 10 s, stalled after 60)
    later = time.time() + 15
    watched = render_watch(watch_path(folder, now=later))
    assert "GONE: no final dump and no sign of life for 15 s since rank 0 failed" in watched, watched
    assert "since the others finished" not in watched and "finished" not in watched, watched
    unknown = "no final dump, only its stream: it still runs, or its process ended and the cause was not recorded"
    assert f"note: rank 1: {unknown}" in render_report(report_path(folder))

    # the same stream written on this host by a process that has ended: every verb says it ended
    stream = folder / "rank1.jsonl"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    text = stream.read_text().replace('"hostname":"recorded-host"', f'"hostname":{json.dumps(socket.gethostname())}')
    stream.write_text(re.sub(r'"pid":\d+', f'"pid":{int(dead.stdout)}', text))
    ended = "its process ended without a final dump and the cause was not recorded"
    assert f"rank 1: {ended}" in render_check(check_path(folder))
    reported = render_report(report_path(folder))
    assert f"note: rank 1: {ended}" in reported and "it still runs" not in reported, reported
    watched = render_watch(watch_path(folder))
    assert "GONE: rank 1 stopped in step 2: its process has ended, without a final dump" in watched, watched
