"""The folder page's "wait caused" view (issue 39): the heatmap shows the wait each rank made the
others spend where it arrived last, marks the late ranks `commdebug report` lists (the row label
names the rank), and a click on a marked cell lists its late calls with the gap and the lines."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from synthetic import write_rank_dumps

HEATMAP = '[data-testid="rank-step-heatmap"]'
LATE = {1: (5, 0.3), 3: (11, 0.2)}  # step -> (the rank that comes late to its first call, seconds)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """16 ranks x 4 steps in one group of 16; rank 5 comes 300 ms late at step 1, rank 11 200 ms at step 3."""
    out = tmp_path_factory.mktemp("late16")
    write_rank_dumps(out, ranks=16, layers=1, steps=4, world_size=16, dim=64, ffn=256, vocab=256, tokens=32, late=LATE)
    return out


def outliers(page) -> list[tuple[int, int]]:
    return page.eval_on_selector_all(f"{HEATMAP} .cell.outlier", "els => els.map(e => [Number(e.dataset.rank), Number(e.dataset.step)])")


def test_wait_caused_view_marks_and_names_the_late_ranks(viewer, job):
    page = viewer.open_ranks(job)
    caused = page.locator('[data-testid="heatmap-view-caused"]')
    expect(caused).to_be_enabled()
    page.locator("#heat-metric label", has_text="wait caused").click()
    expect(caused).to_be_checked()
    expect(page.locator("#heat-what")).to_contain_text("wait caused")
    assert sorted(map(tuple, outliers(page))) == sorted((rank, step) for step, (rank, _) in LATE.items())
    # the row labels of the late ranks are the outlier labels, and they name the rank
    labels = page.eval_on_selector_all(f"{HEATMAP} .row-label.outlier", "els => els.map(e => [e.dataset.outlierRank, e.textContent])")
    assert sorted(int(r) for r, _ in labels) == [5, 11] and all(text.strip() == r for r, text in labels)
    expect(page.locator("#heat-legend")).to_contain_text("late rank: it arrived last")
    expect(page.locator("#heat-note")).to_contain_text("Marked: the 2 (rank, step) pairs")
    # pointing at the cell says what it caused
    cell = page.locator(f'{HEATMAP} .cell[data-rank="5"][data-step="1"]')
    cell.hover()
    expect(page.locator("#heatmap-hover")).to_contain_text("late rank: made 15 ranks wait")
    # the time view reads it the other way round: the late rank is the one that waited least
    page.locator("#heat-metric label", has_text="time").first.click()
    expect(cell).to_have_class(re.compile(r"\boutlier low\b"))


def test_a_late_cell_lists_its_calls_with_the_gap_and_the_two_lines(viewer, job):
    page = viewer.open_ranks(job)
    page.locator("#heat-metric label", has_text="wait caused").click()
    page.locator(f'{HEATMAP} .cell[data-rank="5"][data-step="1"]').click()
    box = page.locator('[data-testid="late-calls"]')
    expect(box).to_be_visible()
    expect(box).to_contain_text("Rank 5 arrived last here")
    [item] = box.locator("li").all()
    text = item.text_content()
    assert text.startswith("barrier #") and "on mesh_tp[16]" in text and "at train.py:" in text, text
    assert "made 15 ranks wait" in text and "(300 ms at most)" in text, text
    assert "its gap before it: 301 ms, from all_reduce #" in text and "the ranks that waited: 1.00 ms" in text, text
    # a cell with no late call lists none
    page.locator(f'{HEATMAP} .cell[data-rank="4"][data-step="1"]').click()
    expect(page.locator('[data-testid="late-calls"]')).to_have_count(0)


def test_a_wait_passed_on_is_marked_at_its_root_and_start_up_in_no_cell(viewer, tmp_path):
    """The 2-D job (tests/timeline.py): rank 3 sleeps before its pair all_reduce at step 3, rank 2
    then comes last to the world call; the processes started apart. Only rank 3's cell is marked,
    its calls say where the wait went, and the start carries no wait."""
    from timeline import pair_then_world, simulate, write_views

    views = simulate(pair_then_world(), 4, 6, starts={0: 0.0, 1: 0.2, 2: 0.42, 3: 0.1}, delays={(3, 3, 0): 0.5, (2, 3, 1): 2e-4})
    page = viewer.open_ranks(write_views(views, tmp_path / "twod"), name="twod.html")
    page.locator("#heat-metric label", has_text="wait caused").click()
    assert outliers(page) == [[3, 3]]
    expect(page.locator("#heat-note")).to_contain_text("Start-up skew (the processes reaching their first collective apart) is in no cell")
    # rank 2 started last: its first call made the others wait 420 ms, and names no late rank
    page.locator(f'{HEATMAP} .cell[data-rank="2"][data-step="0"]').hover()
    expect(page.locator("#heatmap-hover")).to_contain_text("rank 2")
    expect(page.locator("#heatmap-hover")).not_to_contain_text("late rank")
    page.locator(f'{HEATMAP} .cell[data-rank="3"][data-step="3"]').click()
    box = page.locator('[data-testid="late-calls"]')
    expect(box).to_contain_text("Rank 3 arrived last here by its own work")
    [item] = box.locator("li").all()
    text = item.text_content()
    assert text.startswith("all_reduce #3 on group 2[2] at job.py:24: made 1 rank wait 500 ms"), text
    assert "passed on through all_reduce #3 on default_pg[4] at job.py:25 (rank 2 came last there): 1.50 s of waiting in all" in text, text
