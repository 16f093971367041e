"""The folder page's traffic between ranks (issue 31): for an all_to_all group and step, the rank x
rank matrix is what ``summary --by peer`` counts (the cells summed over the steps are its rows,
and each step's cells are ``peer_rows(by_step=True)``'s), the imbalance per step is ``report``'s,
and one rank's dump with uneven all_to_all opens in the single-dump viewer showing its splits."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from playwright.sync_api import expect
from test_moe import DEADLINE_S, cli, skewed_router

import commdebug

MATRIX = '[data-testid="traffic-matrix"]'


@pytest.fixture(scope="module")
def moe(shared_run):
    """Tutorial 12's skewed MoE layer, 4 ranks of the fake backend, 3 steps (the run's shared folder)."""
    return skewed_router(shared_run)[0]


def matrix_cells(page) -> list[tuple[int, int, int, int]]:
    return [tuple(c) for c in page.eval_on_selector_all(f"{MATRIX} [data-src]", """els => els.map(e =>
        [Number(e.dataset.src), Number(e.dataset.dst), Number(e.dataset.calls), Number(e.dataset.bytes)])""")]


@pytest.mark.timeout(DEADLINE_S + 120)
def test_the_matrix_cells_are_the_peer_rows_and_the_imbalance_is_reports(viewer, moe):
    page = viewer.open_ranks(moe)
    section = page.locator("#traffic-section")
    expect(section).to_be_visible()
    per_step = {}
    steps = page.eval_on_selector_all("#traffic-step option", "os => os.map(o => Number(o.value))")
    assert steps == [0, 1, 2]
    for step in steps:
        page.select_option("#traffic-step", str(step))
        expect(page.locator(MATRIX)).to_have_attribute("data-step", str(step))
        per_step[step] = sorted(matrix_cells(page))
    # each step's cells: peer_rows by step; a 4-member group: every pair, the diagonal too
    by_step = commdebug.traffic_path(moe, by_step=True).peers
    for step, cells in per_step.items():
        assert cells == sorted((r.src, r.dst, r.calls, r.bytes) for r in by_step if r.step == step)
        assert len(cells) == 16 and len({c[3] for c in cells}) > 2  # really uneven
    # summed over the steps: summary --by peer --json, as a user gets it
    done = cli("summary", str(moe), "--by", "peer", "--json")
    assert done.returncode == 0, done.stderr
    rows = {(r["src"], r["dst"]): (r["calls"], r["bytes"]) for r in json.loads(done.stdout)["rows"]}
    summed: Counter = Counter()
    for cells in per_step.values():
        for src, dst, calls, nbytes in cells:
            summed[(src, dst, "calls")] += calls
            summed[(src, dst, "bytes")] += nbytes
    assert {(s, d): (summed[(s, d, "calls")], summed[(s, d, "bytes")]) for s, d in rows} == rows
    # the imbalance per step is report's, and the page opens on the worst step
    report = json.loads(cli("report", str(moe), "--json").stdout)["all_to_all_imbalance"]
    shown = page.eval_on_selector_all("#imbalance-per-step tbody tr", """rs => rs.map(r =>
        [Number(r.dataset.step), Number(r.dataset.factor), Number(r.dataset.rank)])""")
    assert shown == sorted([r["step"], round(r["factor"], 4), r["rank"]] for r in report)
    page.reload()
    page.wait_for_selector("body:not([data-state=loading])", state="attached")
    expect(page.locator(MATRIX)).to_have_attribute("data-step", str(report[0]["step"]))
    expect(page.locator("#imbalance-per-step tr.selected")).to_have_attribute("data-rank", str(report[0]["rank"]))
    # a row of the imbalance table shows that step's matrix
    other = next(r["step"] for r in report[1:])
    page.locator(f'#imbalance-per-step tr[data-step="{other}"]').click()
    expect(page.locator(MATRIX)).to_have_attribute("data-step", str(other))


def test_a_large_group_embeds_its_heaviest_pairs_and_says_so(viewer, moe, monkeypatch):
    import visualizer

    monkeypatch.setattr(visualizer, "MATRIX_MEMBERS", 2)
    monkeypatch.setattr(visualizer, "TOP_PAIRS", 5)
    page = viewer.open_ranks(moe)
    expect(page.locator("#traffic-note")).to_contain_text("5 heaviest pairs only")
    cells = matrix_cells(page)
    step = int(page.locator(MATRIX).get_attribute("data-step"))
    heaviest = sorted((r for r in commdebug.traffic_path(moe, by_step=True).peers if r.step == step),
                      key=lambda r: (-r.bytes, r.src, r.dst))[:5]
    assert sorted(cells) == sorted((r.src, r.dst, r.calls, r.bytes) for r in heaviest)


def test_a_dump_with_uneven_all_to_all_opens_and_an_event_shows_its_splits(viewer, moe):
    dump = json.loads((moe / "rank0.json").read_text())
    page = viewer.open(dump)
    assert viewer.state() == "ready"
    trace = commdebug.load(moe / "rank0.json")
    uneven = next(e for e in trace.events if e.send_splits is not None and len(set(e.recv_splits)) > 1)
    page.locator(f'#events-grid tr[data-index="{uneven.index}"] td').first.click()  # not the module's link
    detail = page.locator("#event-fields")
    ranks = trace.groups[uneven.group.name].ranks
    assert ranks == (0, 1, 2, 3)
    for field, splits in (("sent to each member", uneven.send_splits), ("received from each member", uneven.recv_splits)):
        code = detail.locator(f'tr[data-field="{field}"] code.splits')
        assert [int(b) for b in code.get_attribute("data-bytes").split(",")] == list(splits)
        assert [part.split()[0] for part in code.text_content().split(", ")] == [f"r{r}" for r in ranks]
    # an op without splits shows no such rows
    plain = next(i for i, e in enumerate(trace.events) if e.send_splits is None) if any(e.send_splits is None for e in trace.events) else None
    assert plain is None  # every call of this layer is an all_to_all
