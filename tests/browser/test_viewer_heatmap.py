"""The folder page's rank x step heatmap and per-op spread (issue 19): a job's slow rank at one
step is the cell that stands out, and clicking it shows that rank."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from synthetic import write_rank_dumps

SLOW_RANK, SLOW_STEP = 5, 3
HEATMAP = '[data-testid="rank-step-heatmap"]'


def slow_down(path, step: int, factor: float) -> None:
    """Make one rank's dump `factor` times slower at `step` (every call of that step)."""
    dump = json.loads(path.read_text())
    columns = dump["commdebug"]["events"]["columns"]
    columns["latency_s"] = [lat * factor if s == step else lat for lat, s in zip(columns["latency_s"], columns["step"], strict=True)]
    path.write_text(json.dumps(dump))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """16 ranks x 6 steps; rank 5 is five times slower at step 3."""
    out = tmp_path_factory.mktemp("job16")
    write_rank_dumps(out, ranks=16, layers=1, steps=6, dim=64, ffn=256, vocab=256, tokens=32)
    slow_down(out / f"rank{SLOW_RANK}.json", SLOW_STEP, 5.0)
    return out


def cells(page) -> list[dict]:
    return page.eval_on_selector_all(f"{HEATMAP} .cell", """els => els.map(e => ({
        rank: Number(e.dataset.rank), step: Number(e.dataset.step), outlier: e.classList.contains('outlier'),
        high: e.classList.contains('high'), ranks: e.dataset.ranks || null}))""")


def test_slow_rank_at_one_step_is_the_one_outlier(viewer, job):
    page = viewer.open_ranks(job)
    grid = page.locator(HEATMAP)
    expect(grid).to_be_visible()
    found = cells(page)
    assert len(found) == 96
    assert sorted((c["rank"], c["step"]) for c in found) == [(r, s) for r in range(16) for s in range(6)]
    assert [(c["rank"], c["step"]) for c in found if c["outlier"]] == [(SLOW_RANK, SLOW_STEP)]
    assert next(c for c in found if c["outlier"])["high"]
    # its rank and step are marked on the axes too
    expect(page.locator(f'{HEATMAP} .row-label.outlier')).to_have_attribute("data-rank", str(SLOW_RANK))
    expect(page.locator(f'{HEATMAP} .col-label.outlier')).to_have_attribute("data-step", str(SLOW_STEP))
    expect(page.locator("#heat-what")).to_contain_text("communication time")
    # a legend: the colour scale and the outlier mark
    assert page.locator("#heat-legend .swatch").count() >= 9
    expect(page.locator("#heat-legend")).to_contain_text("outlier")


def test_hover_and_click_select_the_rank_and_step(viewer, job):
    page = viewer.open_ranks(job)
    cell = page.locator(f'{HEATMAP} .cell[data-rank="{SLOW_RANK}"][data-step="{SLOW_STEP}"]')
    cell.hover()
    expect(page.locator("#heatmap-hover")).to_contain_text(f"rank {SLOW_RANK} · step {SLOW_STEP}")
    expect(page.locator("#heatmap-hover")).to_contain_text("outlier (high)")
    expect(page.locator("#meta-rank")).to_have_text("0")
    cell.click()
    # the rank is selected in the tree (its numbers), the selector and the rank panel
    expect(page.locator("#meta-rank")).to_have_text(str(SLOW_RANK))
    expect(page.locator("#rank-select option:checked")).to_have_text(str(SLOW_RANK))
    expect(page.locator("#rank-table tr.current")).to_have_attribute("data-rank", str(SLOW_RANK))
    grid = page.locator(HEATMAP)
    expect(grid).to_have_attribute("data-selected-rank", str(SLOW_RANK))
    expect(grid).to_have_attribute("data-selected-step", str(SLOW_STEP))
    assert "selected" in cell.get_attribute("class").split()
    # and the cell's calls, by op
    expect(page.locator("#heatmap-selection h3")).to_contain_text(f"Rank {SLOW_RANK}, step {SLOW_STEP}")
    ops = page.eval_on_selector_all("#cell-ops tbody tr", "rs => rs.map(r => r.dataset.op)")
    assert ops and set(ops) <= {"all_reduce", "all_gather", "reduce_scatter", "barrier"}
    assert "all_reduce" in ops
    # choosing another rank elsewhere moves the heatmap's mark to its row
    page.select_option("#rank-select", label="2")
    expect(grid).to_have_attribute("data-selected-rank", "2")
    expect(page.locator("#heatmap-selection h3")).to_have_count(0)


def test_bytes_and_calls_switch(viewer, job):
    page = viewer.open_ranks(job)
    page.locator('#heat-metric label', has_text="bytes").click()
    expect(page.locator("#heat-what")).to_contain_text("message bytes")
    found = cells(page)
    assert len(found) == 96 and not any(c["outlier"] for c in found)  # every rank sends the same bytes
    page.locator('#heat-metric label', has_text="calls").click()
    expect(page.locator("#heat-what")).to_contain_text("collective calls")


def test_per_op_spread_names_the_slowest_ranks(viewer, job):
    page = viewer.open_ranks(job)
    rows = page.locator("#op-spread tbody tr")
    assert rows.count() >= 2
    heads = page.eval_on_selector_all("#op-spread thead th", "ths => ths.map(t => t.textContent)")
    assert heads == ["op", "top ranks", "ranks", "calls per rank", "min", "median", "p90", "max"]
    # the slow rank is the slowest on every op it issued at step 3
    for op in ("all_reduce", "all_gather"):
        row = page.locator(f'#op-spread tr[data-op="{op}"]')
        expect(row.locator("td").nth(2)).to_have_text("16")
        expect(row.locator(".rank-link").first).to_have_attribute("data-rank", str(SLOW_RANK))
    page.locator('#op-spread tr[data-op="all_reduce"] .rank-link').first.click()
    expect(page.locator("#meta-rank")).to_have_text(str(SLOW_RANK))


def test_an_untimed_job_shows_bytes(viewer, tmp_path):
    out = tmp_path / "untimed"
    write_rank_dumps(out, ranks=3, layers=1, steps=2, dim=64, ffn=256, vocab=256, tokens=32)
    for f in out.glob("rank*.json"):
        dump = json.loads(f.read_text())
        columns = dump["commdebug"]["events"]["columns"]
        columns["latency_s"] = [None] * len(columns["latency_s"])
        f.write_text(json.dumps(dump))
    page = viewer.open_ranks(out)
    expect(page.locator("#heat-what")).to_contain_text("message bytes")
    expect(page.locator('#heat-metric input[value="time"]')).to_be_disabled()
    expect(page.locator("#heat-note")).to_contain_text("Not timed")
    assert len(cells(page)) == 3 * 2


def test_wide_worlds_group_ranks_per_row_and_say_so(viewer, tmp_path):
    out = tmp_path / "wide"
    write_rank_dumps(out, ranks=130, layers=0, steps=2, dim=64, ffn=256, vocab=256, tokens=32)
    slow_down(out / "rank129.json", 1, 10.0)
    page = viewer.open_ranks(out)
    found = cells(page)
    assert len(found) == 65 * 2  # 2 ranks per row
    assert found[0]["ranks"] == "0-1"
    expect(page.locator("#heat-note")).to_contain_text("each row is 2 consecutive ranks")
    [slow] = [c for c in found if c["outlier"]]
    assert (slow["rank"], slow["step"], slow["ranks"]) == (129, 1, "128-129")
