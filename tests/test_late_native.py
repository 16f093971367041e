"""The late-rank analysis's passes in C (commdebug/analysis/_late.c) and in Python give the same
digests and the same results, to the bit, on the same ranks: the usual case (every call timed,
each group's numbers one run) and each odd one (untimed calls, sends before a group's call,
overlapping calls, holes, numbers out of order, no start times, a field C does not read, an
uneven all_to_all), through `check` and `report` and a profile's gap look-ups. The C module is
optional at install; here it must be built, or the comparison compares nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import commdebug.analysis.late_digest as late_digest_module
import commdebug.analysis.late_tally as late_tally_module
from commdebug.analysis.check import check
from commdebug.analysis.late_digest import LateDigest, late_digest
from commdebug.analysis.report import report
from commdebug.formats.readers import load_rank
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo

from synthetic import write_rank_dumps

RANKS, LATE = 16, {1: (5, 0.3), 2: (12, 0.2)}  # step -> (the rank planted late there, seconds)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """16 ranks in two groups of 8, three steps, a late rank planted at steps 1 and 2."""
    out = tmp_path_factory.mktemp("late_native")
    write_rank_dumps(out, ranks=RANKS, layers=2, steps=3, world_size=8, dim=64, ffn=256, vocab=256, tokens=32, late=LATE)
    return out


@pytest.fixture
def python_only(monkeypatch):
    """The analysis without its C module, as an install without a C compiler runs it."""
    monkeypatch.setattr(late_digest_module, "_late", None)
    monkeypatch.setattr(late_tally_module, "_late", None)


def test_the_c_module_is_built():
    assert late_digest_module._late is not None and late_tally_module._late is not None, \
        "commdebug.analysis._late was not built: pip install -e . (or python setup.py build_ext --inplace) with a C compiler"


def _views(folder: Path) -> list[RankView]:
    return [load_rank(folder / f"rank{r}.json") for r in range(RANKS)]


def _odd(views: list[RankView]) -> list[RankView]:
    """The same job with one oddity per rank on a few ranks (each a path of its own in both)."""
    def edit(r: int, change) -> None:
        views[r].events[:] = change(list(views[r].events))

    def untimed(ev: list[CollectiveEvent]) -> list[CollectiveEvent]:  # a few calls not timed
        return [e._replace(latency_s=None) if i % 7 == 3 else e for i, e in enumerate(ev)]

    def sends(ev: list[CollectiveEvent]) -> list[CollectiveEvent]:  # a send (no sequence number) before some calls
        g = GroupInfo("p2p", "pp", 2, (1, 2))
        out: list[CollectiveEvent] = []
        for i, e in enumerate(ev):
            if i % 11 == 0:
                out.append(e._replace(op="send", group=g, seq=None, peer=2, p2p_seq=i, source="job.py:7", latency_s=0.001))
            out.append(e)
        return out

    def overlap(ev: list[CollectiveEvent]) -> list[CollectiveEvent]:  # asynchronous calls: starts before the call before ends
        return [e._replace(start_s=ev[i - 1].start_s) if i % 5 == 4 else e for i, e in enumerate(ev)]

    def hole(ev: list[CollectiveEvent]) -> list[CollectiveEvent]:  # a call missing from the record
        return ev[:10] + ev[11:]

    def swapped(ev: list[CollectiveEvent]) -> list[CollectiveEvent]:  # two calls recorded out of order
        ev[20], ev[21] = ev[21], ev[20]
        return ev

    def int_latency(ev: list[CollectiveEvent]) -> list[CollectiveEvent]:  # a field C does not read: the rank goes the Python way
        return [e._replace(latency_s=1) if i == 30 else e for i, e in enumerate(ev)]

    for r, change in ((1, untimed), (2, sends), (3, overlap), (5, hole), (9, swapped), (10, int_latency)):
        edit(r, change)
    return views


def _digest_values(d: LateDigest) -> list:
    """A digest as plain values, site ids read through its table (ids may differ between the ways)."""
    out: list = [d.rank, d.step_list.tolist(), d.step_times.tolist(), d.timed, d.whole]
    for p in d.groups:
        out.append([p.name, p.label, p.size, p.seqs.tolist(), p.lats.tolist(), None if p.gaps is None else p.gaps.tolist(),
                    p.steps.tolist(), [d.table[i] for i in p.sites], [None if i < 0 else d.table[i] for i in p.prev_sites],
                    p.prev_seqs.tolist(), [None if i < 0 else d.groups[i].name for i in p.prev_groups], p.prev_lats.tolist(), p.ordinals.tolist(),
                    None if p.starts is None else p.starts.tolist(), p.run, p.uneven])
    return out


def _both(monkeypatch, make):
    """`make()` with the C module, then without it."""
    native = make()
    with monkeypatch.context() as m:
        m.setattr(late_digest_module, "_late", None)
        m.setattr(late_tally_module, "_late", None)
        python = make()
    return native, python


@pytest.mark.parametrize("odd", [False, True], ids=["usual", "odd"])
def test_the_digests_are_the_same_both_ways(folder, monkeypatch, odd):
    views = _odd(_views(folder)) if odd else _views(folder)
    for starts in (True, False):
        native, python = _both(monkeypatch, lambda starts=starts: [_digest_values(late_digest(v.rank, v.events, starts=starts)) for v in views])
        assert native == python
    # what the odd ranks make of it: gaps made 0 where calls overlap, no run where numbers have a hole or go back
    if odd:
        d3 = late_digest(3, views[3].events)
        assert d3.groups[0].gaps is not None and 0.0 in d3.groups[0].gaps.tolist()
        assert not late_digest(5, views[5].events).groups[0].run and not late_digest(9, views[9].events).groups[0].run
        assert late_digest(2, views[2].events).groups[0].prev_seqs.tolist().count(-1) > 1  # a send before: no number


def _results(views: list[RankView], gaps_seen: list) -> tuple[str, str, list]:
    def gap_ops(rank: int, start: float, end: float) -> list:
        gaps_seen.append((rank, start, end))
        return []

    gaps_seen.clear()
    rep = report(views, gap_ops=gap_ops)
    return json.dumps(check(views).to_dict()), json.dumps(rep.to_dict()), list(gaps_seen)


@pytest.mark.parametrize("odd", [False, True], ids=["usual", "odd"])
def test_check_and_report_say_the_same_both_ways_and_name_the_planted_ranks(folder, monkeypatch, odd):
    seen: list = []
    native, python = _both(monkeypatch, lambda: _results(_odd(_views(folder)) if odd else _views(folder), seen))
    assert native == python
    late = json.loads(native[1])["late_ranks"]
    # the odd ranks leave some calls out (a call untimed on one member is not analysed), so the
    # planted ones may come in another order, but they come first
    assert {(e["step"], e["rank"]) for e in late[:2]} == {(1, 5), (2, 12)}, late
    if not odd:
        assert [(e["step"], e["rank"]) for e in late[:2]] == [(1, 5), (2, 12)]
        assert late[0]["caused_s"] == pytest.approx(7 * 0.3, rel=0.05) and native[2][0][0] == 5  # its gap looked up in its profile
    assert json.loads(native[0])["late_ranks"][0] == late[0]  # check names the same first one


def test_without_start_times_both_ways_say_the_gaps_are_unknown(folder, monkeypatch):
    def views() -> list[RankView]:
        out = _views(folder)
        for v in out:
            v.events[:] = [e._replace(start_s=None) for e in v.events]
        return out

    seen: list = []
    native, python = _both(monkeypatch, lambda: _results(views(), seen))
    assert native == python
    data = json.loads(native[1])
    assert data["late_analysis"]["gaps_known"] is False and data["late_ranks"][0]["gap_s"] is None


def test_an_uneven_all_to_all_is_left_out_both_ways(folder, monkeypatch):
    def views(splits: tuple[int, ...]) -> list[RankView]:
        out = _views(folder)
        for v in out:  # step 1's first call (the late one) made an all_to_all
            i = next(i for i, e in enumerate(v.events) if e.step == 1)
            v.events[i] = v.events[i]._replace(op="all_to_all", send_splits=splits, recv_splits=splits)
        return out

    for splits, named in (((16,) * 8, True), ((8, 24, 16, 16, 16, 16, 16, 16), False)):
        native, python = _both(monkeypatch, lambda splits=splits: report(views(splits)).to_dict())
        assert native == python
        assert ((1, 5) in [(e["step"], e["rank"]) for e in native["late_ranks"]]) is named


def test_the_python_way_alone_names_the_planted_ranks(folder, python_only):
    """The fallback on its own (no comparison to lean on): the plants, first, at their steps."""
    assert late_digest_module._late is None
    late = report(_views(folder)).late
    assert late is not None and [(e.step, e.rank) for e in late.entries[:2]] == [(1, 5), (2, 12)]


def test_a_group_settled_as_soon_as_complete_sums_as_one_settled_at_the_end(folder, monkeypatch):
    """A group's columns are freed once its last member is added; its waits are still summed in
    the order the groups were first summed in, so the results do not depend on when each group
    settled: the same to the bit as with the groups' sizes unknown (settled at the end only).
    The ranks come so that the first group summed is the last to complete (batches flushed
    early), which makes the second wait for it."""
    from dataclasses import replace

    from commdebug.analysis.late_tally import LateTally

    monkeypatch.setattr(late_tally_module, "PENDING", 2)
    views = _views(folder)
    order = [0, *range(8, 16), *range(1, 8)]
    digests = [late_digest(views[r].rank, views[r].events) for r in order]

    def run(hide_sizes: bool) -> tuple:
        tally = LateTally()
        for d in digests:
            tally.add(replace(d, groups=[g._replace(size=0) for g in d.groups]) if hide_sizes else d)
            if not hide_sizes and d is digests[8]:  # the second group is complete, the first not yet
                settled = [c.settled is not None for c in tally.groups.values()]
                assert settled == [False, True] and tally._summed == 0
        late = tally.result()
        return json.dumps(late.to_dict()), list(late.by_step.items()), late.caused_by_rank, late.analysed, late.partial

    early, at_end = run(False), run(True)
    assert early == at_end and early[3] > 0
    assert [(e["step"], e["rank"]) for e in json.loads(early[0])[:2]] == [(1, 5), (2, 12)]
