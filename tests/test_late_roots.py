"""The right rank and the right cause (issue 46): a wait passed on through another group is blamed
on the rank whose own work made it late (its root), never on the messenger; the processes
reaching their first collective apart is start-up skew, never a late rank. Ranks simulated in
process (tests/timeline.py: each rank its own clock, waits where real ranks have them), the C and
the Python analysis alike; the CLI once on a folder of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from timeline import SOURCE, Slot, pair_then_world, simulate, world_group, world_only, write_views

import commdebug.analysis.late_digest as late_digest_module
import commdebug.analysis.late_tally as late_tally_module
from commdebug.analysis.check import check
from commdebug.analysis.late import LateThreshold
from commdebug.analysis.report import report
from commdebug.render.check import render_check
from commdebug.render.report import render_report

ROOT = Path(__file__).resolve().parents[1]
PAIR_LINE, WORLD_LINE = 24, 25  # tests/timeline.py's pair_then_world: the pair all_reduce, then the world one
STARTS = {0: 0.0, 1: 0.2, 2: 0.42, 3: 0.1}  # when each rank's process started


@pytest.fixture(params=["C", "Python"])
def way(request, monkeypatch):
    """Each test both ways: the analysis's passes in C, and its Python fallback."""
    if request.param == "Python":
        monkeypatch.setattr(late_digest_module, "_late", None)
        monkeypatch.setattr(late_tally_module, "_late", None)
    return request.param


def two_d(last_at_world: int):
    """The 2-D program: rank 3 sleeps 0.5 s before its pair all_reduce at step 3; at the world
    call after it, `last_at_world` (2 or 3, both held up by that pair call) comes last."""
    delays = {(3, 3, 0): 0.5, (last_at_world, 3, 1): 2e-4}
    return simulate(pair_then_world(), 4, 6, starts=STARTS, delays=delays)


@pytest.mark.parametrize("last_at_world", [2, 3], ids=["rank2-last-at-world", "rank3-last-at-world"])
def test_a_wait_passed_on_through_another_group_is_its_roots(way, last_at_world):
    rep = report(two_d(last_at_world))
    late = rep.late
    assert late is not None
    # one entry: rank 3 at step 3, at its own pair call and line, its own gap; rank 2 nowhere
    assert [(e.step, e.rank) for e in late.entries] == [(3, 3)]
    w = late.entries[0].worst
    assert (w.group, w.seq, w.op, w.source, w.waited) == ("group 2[2]", 3, "all_reduce", f"{SOURCE}:{PAIR_LINE}", 1)
    assert w.caused_s == pytest.approx(0.5, abs=0.01) and w.gap_s == pytest.approx(0.5, abs=0.01) and w.others_gap_s < 0.01
    assert w.after is not None and (w.after.seq, w.after.source) == (2, f"{SOURCE}:{WORLD_LINE}")
    # the world call the wait passed through, who came last there, and every wait counted to the root
    [passed] = w.through
    assert (passed.group, passed.seq, passed.rank, passed.source) == ("default_pg[4]", 3, last_at_world, f"{SOURCE}:{WORLD_LINE}")
    assert passed.caused_s == pytest.approx(1.0, abs=0.02)  # ranks 0 and 1 waited 0.5 s each there
    assert w.chain_caused_s == pytest.approx(1.5, abs=0.03)
    assert late.entries[0].step_caused_s == pytest.approx(w.chain_caused_s, abs=0.01)
    caused = {r.rank: r.caused_wait_s for r in rep.ranks}
    assert caused[3] == pytest.approx(1.5, abs=0.03) and all(caused[r] < 0.01 for r in (0, 1, 2)), caused
    assert late.by_step.get((3, 2), 0.0) < 0.01

    text = render_report(rep)
    at = text.index("  step 3, rank 3: made 1 rank wait 500 ms")
    lines = text[at:].splitlines()
    assert lines[0].endswith(f"in all_reduce #3 on group 2[2] at {SOURCE}:{PAIR_LINE}"), lines[0]
    assert lines[1].startswith("    before it: 50") and f"since all_reduce #2 on default_pg[4] at {SOURCE}:{WORLD_LINE} ended" in lines[1]
    assert lines[2].startswith(f"    passed on through all_reduce #3 on default_pg[4] at {SOURCE}:{WORLD_LINE} "
                               f"(rank {last_at_world} came last there): 1.5"), lines[2]
    assert "rank 2:" not in text.split("late ranks:")[1].split("start-up")[0]
    header = render_check(check(two_d(last_at_world))).splitlines()[1]
    assert header.startswith("  late rank: rank 3 at step 3 made 1 rank wait 500 ms") and f"at {SOURCE}:{PAIR_LINE}, 1.5" in header, header
    assert "with the waits it passed on" in header


def test_a_balanced_job_lists_no_late_rank_and_its_start_up_apart(way):
    rep = report(simulate(world_only(4), 4, 6, starts=STARTS))
    late = rep.late
    assert late is not None and late.analysed == 12 and late.entries == []
    [skew] = late.startup
    assert (skew.rank, skew.after, skew.group, skew.seq, skew.step, skew.source) == (2, 0, "default_pg[4]", 0, 0, f"{SOURCE}:20")
    assert skew.skew_s == pytest.approx(0.42, abs=0.005)
    # in no rank's wait caused, at no step; the jitter after it (every rank left the first call
    # together) stays whose it was
    assert all(r.caused_wait_s is not None and r.caused_wait_s < 0.001 for r in rep.ranks)
    assert max(late.by_step.values(), default=0.0) < 0.001
    assert sum(v for (step, _), v in late.by_step.items() if step >= 1) > 1e-5
    data = rep.to_dict()
    assert data["late_ranks"] == [] and data["startup_skew"] == [
        {"rank": 2, "group": "default_pg[4]", "seq": 0, "op": "all_reduce", "source": f"{SOURCE}:20", "step": 0,
         "skew_s": skew.skew_s, "after_rank": 0, "first_call": True}]
    text = render_report(rep)
    assert "late ranks: none (no rank waited over 50.0 ms and 10% of the step's median communication time for another at one call, " \
           "start-up apart" in text
    assert f"start-up: rank 2 reached the first collective 420 ms after rank 0 (all_reduce #0 on default_pg[4] at {SOURCE}:20)" in text
    assert "since its recording started" not in text
    assert "late rank" not in render_check(check(simulate(world_only(4), 4, 6, starts=STARTS)))


def test_ranks_that_met_only_at_broadcasts_before_are_still_starting_up_at_their_first_meeting(way):
    """A model's parameters broadcast from rank 0 first: receivers do not wait for each other, so
    a rank that started late, and whose first forward took longer too, comes last to the first
    call that makes the ranks meet. Its longer gap there runs from a call the others left long
    before it: start-up, named at that call, never a late rank."""
    world = world_group(4)
    prelude = [Slot(lambda r: world, "broadcast", 10 + k) for k in range(4)]
    views = simulate(world_only(4), 4, 6, starts=STARTS, prelude=prelude, delays={(2, 0, 0): 0.1})
    late = report(views).late
    assert late is not None and late.entries == [], [(e.step, e.rank) for e in late.entries]
    [skew] = late.startup
    assert (skew.rank, skew.group, skew.seq, skew.op, skew.source, skew.first_call) == (2, "default_pg[4]", 4, "all_reduce", f"{SOURCE}:20", False)
    assert skew.skew_s == pytest.approx(0.52, abs=0.01)
    assert all(r.caused_wait_s is not None and r.caused_wait_s < 0.001 for r in report(views).ranks)
    text = render_report(report(views))
    assert (f"start-up: rank 2, before any call had made it meet the others, came 520 ms after rank 0 (all_reduce #4 on default_pg[4] "
            f"at {SOURCE}:20)") in text, text
    # the same wait after the ranks have met once is rank 2's own: a late rank
    late = report(simulate(world_only(4), 4, 6, starts=STARTS, prelude=prelude, delays={(2, 1, 0): 0.1})).late
    assert late is not None and [(e.step, e.rank) for e in late.entries] == [(1, 2)]


def test_start_up_carried_into_another_groups_call_is_start_up_too(way):
    """The pair groups' first calls end apart (each pair waited for its own late starter), so the
    world's first call waits again: still the start, named by the ranks that started last."""
    late = report(simulate(pair_then_world(), 4, 6, starts={0: 0.0, 1: 0.1, 2: 0.0, 3: 0.4})).late
    assert late is not None and late.entries == []
    skews = {(s.rank, s.group): s for s in late.startup}
    assert set(skews) == {(1, "group 1[2]"), (3, "group 2[2]")}
    # rank 3's start held up its pair (0.4 s) and, through it, the world call's first members (0.3 s)
    assert skews[(3, "group 2[2]")].skew_s == pytest.approx(0.4, abs=0.005) and skews[(3, "group 2[2]")].after == 2
    assert skews[(1, "group 1[2]")].skew_s == pytest.approx(0.1, abs=0.005)
    assert max(late.by_step.values(), default=0.0) < 0.001
    # under the threshold nothing is listed, and the start is still in no rank's wait caused;
    # the pair calls after the first world call (both members left it together) keep their jitter
    late = report(simulate(pair_then_world(), 4, 6, starts={0: 0.0, 1: 0.03, 2: 0.04, 3: 0.045})).late
    assert late is not None and late.entries == [] and late.startup == []
    assert max(late.by_step.values(), default=0.0) < 0.001, late.by_step
    assert late.by_step.get((0, 1), 0.0) + late.by_step.get((0, 3), 0.0) < 1e-9  # the pairs' first calls: start-up
    assert sum(v for (step, _), v in late.by_step.items() if step >= 1) > 1e-5


def test_the_first_call_of_a_recording_begun_mid_run_is_nobodys(way):
    """A recording that does not begin with its process (its first event is not the first, as
    after dropped events): the wait at its first call has no gap to measure, so it names no late
    rank, and is no start-up either."""
    late = report(simulate(world_only(4), 4, 4, starts=STARTS, first_index=7)).late
    assert late is not None and late.entries == [] and late.startup == [] and max(late.by_step.values(), default=0.0) < 0.001


def test_a_rank_late_by_its_own_work_at_the_world_call_is_its_own_root(way):
    late = report(simulate(pair_then_world(), 4, 6, starts=STARTS, delays={(1, 2, 1): 0.3})).late
    assert late is not None and [(e.step, e.rank) for e in late.entries] == [(2, 1)]
    w = late.entries[0].worst
    assert (w.group, w.source, w.waited, w.through) == ("default_pg[4]", f"{SOURCE}:{WORLD_LINE}", 3, ())
    assert w.chain_caused_s == w.caused_s == pytest.approx(0.9, abs=0.01)


def test_a_wait_under_the_threshold_in_the_call_before_is_not_passed_on(way):
    """Rank 2 waited 30 ms for rank 3 in their pair call (under the 50 ms threshold), then came
    300 ms late to the world call by its own work: it is the root, rank 3 is named nowhere."""
    views = simulate(pair_then_world(), 4, 6, starts=STARTS, delays={(3, 2, 0): 0.03, (2, 2, 1): 0.3})
    late = report(views).late
    assert late is not None and [(e.step, e.rank) for e in late.entries] == [(2, 2)]
    assert late.entries[0].worst.group == "default_pg[4]" and late.entries[0].worst.through == ()
    # with a threshold under the 30 ms, that wait counts: the pair call was itself late by rank 3's work
    low = report(views, late_threshold=LateThreshold(0.02, 0.0)).late
    assert low is not None and (2, 3) in [(e.step, e.rank) for e in low.entries]


def test_both_ways_say_the_same(monkeypatch):
    def everything() -> list:
        out = []
        for views in (two_d(2), two_d(3), simulate(world_only(4), 4, 6, starts=STARTS),
                      simulate(pair_then_world(), 4, 6, starts={0: 0.0, 1: 0.1, 2: 0.0, 3: 0.4})):
            rep = report(views)
            assert rep.late is not None
            out.append((json.dumps(rep.to_dict()), sorted(rep.late.by_step.items()), json.dumps(check(views).to_dict())))
        return out

    native = everything()
    monkeypatch.setattr(late_digest_module, "_late", None)
    monkeypatch.setattr(late_tally_module, "_late", None)
    assert everything() == native


@pytest.mark.proc
def test_report_and_check_on_a_folder(tmp_path):
    folder = write_views(two_d(2), tmp_path / "twod")
    done = subprocess.run([sys.executable, "-m", "commdebug", "report", str(folder), "--json"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    [entry] = data["late_ranks"]
    assert (entry["step"], entry["rank"], entry["group"], entry["source"]) == (3, 3, "group 2[2]", f"{SOURCE}:{PAIR_LINE}")
    assert [(t["group"], t["seq"], t["op"], t["rank"]) for t in entry["through"]] == [("default_pg[4]", 3, "all_reduce", 2)]
    assert entry["chain_caused_s"] == pytest.approx(1.5, abs=0.03) and entry["calls"][0]["through"] == entry["through"]
    assert {(s["rank"], s["group"]) for s in data["startup_skew"]} == {(1, "group 1[2]"), (2, "group 2[2]")}


def test_a_rank_last_by_jitter_at_its_call_before_is_not_walked_back_to_it(way):
    """Ranks 2 and 3 both work 0.3 s longer before their pair call at step 2 (rank 3 a
    millisecond more: jitter, under the threshold), then come late together to the world call,
    rank 3 last. The pair call made nobody wait long: the walk stops at the world call, where
    ranks 0 and 1 waited, and does not name rank 3's millisecond at the pair call."""
    views = simulate(pair_then_world(), 4, 6, starts=STARTS, delays={(2, 2, 0): 0.3, (3, 2, 0): 0.301, (3, 2, 1): 2e-4})
    late = report(views).late
    assert late is not None and [(e.step, e.rank) for e in late.entries] == [(2, 3)]
    w = late.entries[0].worst
    assert (w.group, w.source, w.waited, w.through) == ("default_pg[4]", f"{SOURCE}:{WORLD_LINE}", 3, ())
    assert w.max_wait_s == pytest.approx(0.3, abs=0.01)
