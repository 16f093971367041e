"""Who made the others wait (issue 39): the late rank named per step, with the wait it caused,
the gap before its call and the two lines around that gap.

A real 4-rank gloo job under `commdebug run --timing` (tests/programs/late_job.py: rank 3 is
busy 0.8 s longer than the others before its all_reduce in step 2); 64-rank folders derived from
a real fake-backend run (tests/ranks_job.py), balanced and with one late rank planted per step;
Flight Recorder dumps with durations; `check`'s header and `watch`'s waiting line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ranks_job import ranks_scale, shared_job, write_job
from test_predict import fr_rank

from commdebug.analysis.late import LateThreshold
from commdebug.analysis.report import report_path
from commdebug.analysis.watch import Call, RankLive, watch
from commdebug.render.watch import render_watch

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "late_job.py"
LINES = JOB.read_text().splitlines()
BARRIER_LINE = next(i for i, line in enumerate(LINES, 1) if "dist.barrier()" in line)
ALL_REDUCE_LINE = next(i for i, line in enumerate(LINES, 1) if "dist.all_reduce(" in line)
LATE_RANK, LATE_STEP, LATE_S = 3, 2, 0.8
DEADLINE_S = 180


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def late_run(tmp_path_factory) -> Path:
    """The job's dump folder. gloo in torch 2.13 sometimes aborts a rank in interpreter teardown
    after the program finished (docs/ranks.md): accepted only when every rank said its dump was
    complete."""
    cwd = tmp_path_factory.mktemp("late")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LATE_RANK": str(LATE_RANK), "LATE_STEP": str(LATE_STEP), "LATE_S": str(LATE_S)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           "-m", "commdebug", "run", "--out", "traces", "--timing", "--", str(JOB)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=DEADLINE_S)
    finished = [line for line in proc.stderr.splitlines() if "commdebug: program finished (exit 0); dump complete" in line]
    if proc.returncode != 0:
        assert len(finished) == 4 and "SIGABRT" in proc.stderr, proc.stderr[-3000:]
    return cwd / "traces"


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 120)
def test_the_late_rank_is_named_first_with_the_wait_it_caused_and_the_lines_around_its_gap(late_run):
    proc = cli("report", str(late_run), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    first = data["late_ranks"][0]
    assert (first["step"], first["rank"], first["op"], first["group"], first["waited"]) == (LATE_STEP, LATE_RANK, "all_reduce", "default_pg[4]", 3)
    # the three others each waited about the delay (a loaded machine adds, never takes away much)
    assert 3 * 0.6 <= first["caused_s"] <= 3 * 2.0 and 0.6 <= first["max_wait_s"] <= 2.0, first
    assert 0.6 <= first["gap_s"] <= 2.0 and first["others_gap_s"] < 0.3, first
    assert first["after"] == {"op": "barrier", "seq": 2 * LATE_STEP, "source": f"{JOB}:{BARRIER_LINE}", "module": "Global",
                              "group": "default_pg[4]"}
    assert first["before"] == {"op": "all_reduce", "seq": 2 * LATE_STEP + 1, "source": f"{JOB}:{ALL_REDUCE_LINE}", "module": "Global",
                               "group": "default_pg[4]"}
    assert first["source"] == f"{JOB}:{ALL_REDUCE_LINE}" and first["seq"] == 2 * LATE_STEP + 1
    assert first["gap_top"] == []  # no profiler traces in this folder
    # nothing else is named at its step, nothing comes near it, and the job's start-up (the
    # processes come to their first call at different moments) names no late rank: it is apart
    others = data["late_ranks"][1:]
    assert all(e["step"] != LATE_STEP for e in others), others
    assert all(e["caused_s"] < first["caused_s"] / 4 and (e["step"], e["seq"]) != (0, 0) for e in others), others
    assert all((s["step"], s["seq"], s["op"]) == (0, 0, "barrier") for s in data["startup_skew"]), data["startup_skew"]
    caused = {r["rank"]: r["caused_wait_s"] for r in data["ranks"]}
    assert caused[LATE_RANK] >= first["caused_s"] and max(caused, key=caused.get) == LATE_RANK
    # the other columns stay what they were: ranks 0-2 waited (straggler time), rank 3 did not
    straggler = {r["rank"]: r["straggler_s"] for r in data["ranks"]}
    assert min(straggler, key=straggler.get) == LATE_RANK

    text = cli("report", str(late_run)).stdout
    assert f"  step {LATE_STEP}, rank {LATE_RANK}: made 3 ranks wait " in text, text
    gap_line = text.splitlines()[text.splitlines().index(next(line for line in text.splitlines() if line.startswith(f"  step {LATE_STEP}, rank {LATE_RANK}:"))) + 1]
    assert gap_line.startswith("    before it: ") and f"since barrier #{2 * LATE_STEP} on default_pg[4] at {JOB}:{BARRIER_LINE} ended" in gap_line, gap_line
    assert "listed where a rank waited over 50.0 ms and 10% of the step's median communication time" in text

    # --top ranks by it too: the late rank is the one furthest from the median, by the wait it caused
    top = json.loads(cli("report", str(late_run), "--json", "--top", "1").stdout)["ranks"]
    assert (top[0]["rank"], top[0]["deviation"]["figure"]) == (LATE_RANK, "caused_wait_s")


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 120)
def test_check_names_the_worst_late_rank_in_its_header_and_keeps_its_exit_status(late_run):
    proc = cli("check", str(late_run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "consistent: 4 ranks, 1 group, 8 collectives per rank"
    assert lines[1].startswith(f"  late rank: rank {LATE_RANK} at step {LATE_STEP} made 3 ranks wait "), lines[1]
    assert f"in all_reduce #{2 * LATE_STEP + 1} on default_pg[4] at {JOB}:{ALL_REDUCE_LINE}" in lines[1]
    assert json.loads(cli("check", str(late_run), "--json").stdout)["late_ranks"][0]["rank"] == LATE_RANK


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 120)
def test_threshold_option_and_a_ranks_selection_that_leaves_members_out(late_run):
    high = json.loads(cli("report", str(late_run), "--json", "--late-threshold", "5").stdout)
    assert high["late_ranks"] == [] and high["late_analysis"]["threshold"] == {"seconds": 5.0, "fraction": 0.1}
    assert "late ranks: none (no rank waited over 5.00 s and 10% of" in cli("report", str(late_run), "--late-threshold", "5,10%").stdout
    bad = cli("report", str(late_run), "--late-threshold", "soon")
    assert bad.returncode == 2 and "--late-threshold: must be seconds, or seconds,percent" in bad.stderr and "Traceback" not in bad.stderr
    part = cli("report", str(late_run), "--ranks", "0-2")
    assert "late ranks: no call was timed on every member of its group (8 on only some): the wait a late rank caused " \
           "needs every member's dump" in part.stdout, part.stdout
    assert json.loads(cli("report", str(late_run), "--ranks", "0-2", "--json").stdout)["late_ranks"] == []


@pytest.fixture(scope="module")
def jobs(shared_run, tmp_path_factory) -> tuple[Path, Path, dict[int, int]]:
    """64 ranks of a real TP + FSDP2 run on the fake backend, every rank's latencies its own:
    as recorded (balanced: no rank comes late; the run's shared job), and with one late rank
    planted per step (this module's own, from the same real runs)."""
    balanced = shared_job(shared_run, 64)
    late = {0: 3, 1: 12, 2: 55, 3: 60}  # step -> the rank that comes LATE_S late to its TP group's first call
    out = tmp_path_factory.mktemp("jobs64") / "late"
    write_job(out, 64, late=late)
    return balanced.folder, out, late


@pytest.mark.proc
def test_a_balanced_job_lists_no_late_rank(jobs):
    balanced, _, _ = jobs
    rep = report_path(balanced)
    assert rep.late is not None and rep.late.analysed > 0 and rep.late.entries == []
    assert all(r.caused_wait_s is not None and r.caused_wait_s < 0.05 for r in rep.ranks)  # jitter only
    assert "late ranks: none (no rank waited over 50.0 ms" in cli("report", str(balanced)).stdout
    assert "late rank:" not in cli("check", str(balanced)).stdout


@pytest.mark.proc
def test_one_late_rank_per_step_is_named_at_its_step_with_the_group_that_waited(jobs):
    _, late_folder, late = jobs
    rep = report_path(late_folder)
    assert rep.late is not None
    named = sorted((e.step, e.rank) for e in rep.late.entries)
    assert named == sorted(late.items())
    for e in rep.late.entries:
        w = e.worst
        assert (w.group, w.waited) == ("mesh_tp[8]", 7)
        assert w.caused_s == pytest.approx(7 * ranks_scale.LATE_S, rel=0.05) and w.max_wait_s == pytest.approx(ranks_scale.LATE_S, rel=0.05)
        assert w.gap_s is not None and w.others_gap_s is not None
        assert w.gap_s - w.others_gap_s == pytest.approx(ranks_scale.LATE_S, abs=0.01)
        assert w.before.seq == w.seq and w.after is not None and w.before.source and w.after.source
    assert LateThreshold.parse("0.2").seconds == 0.2 and report_path(late_folder, late_threshold=LateThreshold(0.2)).late.entries == []


@pytest.mark.proc
def test_flight_recorder_durations_name_the_late_rank_and_say_the_gap_is_unknown(tmp_path):
    # rank 1 comes 300 ms late to call 2: rank 0 waits inside it (Flight Recorder's durations)
    folder = tmp_path / "fr"
    folder.mkdir()
    for r, calls in enumerate(([(1024, 1.0), (1024, 1.0), (1024, 301.0), (1024, 1.0)], [(1024, 1.0), (1024, 1.2), (1024, 1.0), (1024, 1.1)])):
        (folder / f"fr_trace_{r}.json").write_text(json.dumps(fr_rank(r, calls)))
    data = json.loads(cli("report", str(folder), "--json").stdout)
    [entry] = data["late_ranks"]
    assert (entry["rank"], entry["seq"], entry["waited"]) == (1, 2, 1) and entry["caused_s"] == pytest.approx(0.3)
    assert entry["gap_s"] is None and entry["others_gap_s"] is None and data["late_analysis"]["gaps_known"] is False
    text = cli("report", str(folder)).stdout
    assert text.count("the gap before a late call is unknown where dumps have no start times") == 1, text


@pytest.mark.proc
def test_without_timing_it_says_once_that_the_wait_needs_timing(tmp_path):
    from synthetic import write_rank_dumps

    folder = tmp_path / "untimed"
    write_rank_dumps(folder, ranks=4, layers=1, steps=2, dim=64, ffn=256, vocab=256, tokens=32)
    for f in folder.glob("rank*.json"):
        dump = json.loads(f.read_text())
        dump["commdebug"]["events"]["columns"]["latency_s"] = [None] * dump["commdebug"]["events"]["count"]
        f.write_text(json.dumps(dump))
    text = cli("report", str(folder)).stdout
    assert text.count("the wait a late rank caused needs timing (record with --timing; Flight Recorder dumps: with durations") == 1, text
    assert json.loads(cli("report", str(folder), "--json").stdout)["late_ranks"] == []


def test_watch_names_the_rank_the_others_wait_for_and_where_it_was_last_seen():
    now = 1000.0
    members = [0, 1, 2, 3]
    inside = Call("all_reduce", "default_pg[4]", 5, None, "job.py:31", 2, True, now - 12, members)
    seen = Call("barrier", "default_pg[4]", 4, None, "job.py:28", 2, False, None, members)

    def rank(r: int, waiting: Call | None) -> RankLive:
        return RankLive(r, None, 2, now - 12, now, None, waiting or seen, waiting)

    result = watch([rank(0, inside), rank(1, inside), rank(2, inside), rank(3, None)], now=now)
    assert result.healthy and not result.stalled  # no new state: it still only waits
    verdict = render_watch(result).splitlines()[-1]
    assert verdict.startswith("waiting: rank 0 waits 12 s in all_reduce #5 on default_pg[4] at job.py:31;"), verdict
    assert "; they wait for rank 3, last seen in barrier #4 on default_pg[4] at job.py:28 (a hang if" in verdict, verdict
    # where the dumps do not name the group's members, nothing is guessed
    blind = Call("all_reduce", "default_pg[4]", 5, None, "job.py:31", 2, True, now - 12)
    text = render_watch(watch([rank(0, blind), rank(3, None)], now=now))
    assert "they wait for" not in text


def test_an_uneven_all_to_all_is_left_out(tmp_path):
    """The members of an uneven all_to_all move different bytes, so their times differ by more
    than when each came: such a call names no late rank; an even one does."""
    from commdebug.analysis.report import report
    from commdebug.formats.readers import load_rank

    from synthetic import write_rank_dumps

    write_rank_dumps(tmp_path, ranks=4, layers=1, steps=2, world_size=4, dim=64, ffn=256, vocab=256, tokens=32, late={1: (2, 0.3)})

    def ranks(splits: tuple[int, ...]) -> list:
        views = [load_rank(tmp_path / f"rank{r}.json") for r in range(4)]
        for v in views:  # the late call, step 1's first, made an all_to_all
            i = next(i for i, e in enumerate(v.events) if e.step == 1)
            v.events[i] = v.events[i]._replace(op="all_to_all", send_splits=splits, recv_splits=splits)
        return views

    even = report(ranks((16, 16, 16, 16))).late
    assert even is not None and [(e.step, e.rank, e.worst.op) for e in even.entries] == [(1, 2, "all_to_all")]
    uneven = report(ranks((8, 24, 16, 16))).late
    assert uneven is not None and uneven.entries == [] and uneven.analysed == even.analysed - 1
