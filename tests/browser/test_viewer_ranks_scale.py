"""The folder page of a 1,024-rank job (issue 32): the slow rank's row is labelled with its
number, the rank that skipped a call is marked, a clicked cell lists that rank's own figures,
the across-ranks panel names a few ranks per extreme, and the culprit-naming column fits."""

from __future__ import annotations

import math
import re
from collections import defaultdict

import pytest
from playwright.sync_api import expect
from ranks_job import shared_job

import commdebug

HEATMAP = '[data-testid="rank-step-heatmap"]'
LABEL = '[data-testid="heatmap-row-label"]'
DURATION = re.compile(r"^\d+(\.\d+)? (s|ms|us|ns)$")


@pytest.fixture(scope="module")
def job(shared_run):
    return shared_job(shared_run, 1024)


def own_cells(path, step):
    by_op = defaultdict(lambda: [0, 0, []])
    for e in commdebug.load(path).events:
        if e.step == step:
            c = by_op[e.op]
            c[0] += 1
            c[1] += e.size_bytes
            c[2].append(e.latency_s)
    return {op: (calls, nbytes, math.fsum(lats)) for op, (calls, nbytes, lats) in by_op.items()}


def cell_detail(page) -> dict:
    return page.eval_on_selector_all('[data-testid="cell-detail"] tbody tr', """rs => Object.fromEntries(rs.map(r =>
        [r.dataset.op, [Number(r.dataset.calls), Number(r.dataset.bytes), Number(r.dataset.timeUs), r.cells[3].textContent]]))""")


def test_the_slow_rank_and_the_skipping_rank_are_labelled(ranks_page, job):
    page = ranks_page
    slow = page.locator(f'{HEATMAP} {LABEL}[data-outlier-rank="{job.slow}"]')
    expect(slow).to_have_count(1)
    expect(slow).to_contain_text(str(job.slow))
    flagged = page.locator(f'{HEATMAP} {LABEL}[data-finding-rank="{job.skip}"]')
    expect(flagged).to_have_count(1)
    expect(flagged).to_contain_text(str(job.skip))
    # the rank's cell at the finding's step is marked too, on every view
    for metric in ("calls", "time"):
        page.locator("#heat-metric label", has_text=metric).click()
        expect(page.locator(f'{HEATMAP} .cell.flagged[data-finding-rank="{job.skip}"][data-step="{job.skip_step}"]')).to_have_count(1)
    # no label is clipped: each is as wide as its text
    clipped = page.eval_on_selector_all(f"{HEATMAP} {LABEL}", "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)")
    assert clipped == []
    texts = page.eval_on_selector_all(f"{HEATMAP} {LABEL}", "els => els.map(e => e.textContent).filter(Boolean)")
    assert any(re.fullmatch(r"10\d\d–10\d\d", t) for t in texts), texts  # the widest, whole


def test_a_clicked_cell_lists_that_ranks_own_figures(ranks_page, job):
    page = ranks_page
    for rank, step in ((job.slow, job.slow_steps[-1]), (job.skip, job.skip_step)):
        page.locator(f'{HEATMAP} .cell[data-rank="{rank}"][data-step="{step}"]').click()
        expect(page.locator("#meta-rank")).to_have_text(str(rank))
        shown = cell_detail(page)
        want = own_cells(job.folder / f"rank{rank}.json", step)
        assert set(shown) == set(want), rank
        for op, (calls, nbytes, us, text) in shown.items():
            assert (calls, nbytes) == tuple(want[op][:2]), (rank, op)
            assert us == want[op][2] * 1e6, (rank, op, us, want[op][2])  # exact: the sum of its latencies, in us
            assert DURATION.match(text), text
        # its row is loaded into the per-rank table and scrolled into the pane
        row = page.locator(f'#rank-table tr[data-rank="{rank}"]')
        expect(row).to_have_class(re.compile("current"))
        box, pane = row.bounding_box(), page.locator("#detail").evaluate(
            "el => { const p = el.closest('.pane') || el; const r = p.getBoundingClientRect(); return {y: r.y, height: r.height}; }")
        assert pane["y"] <= box["y"] and box["y"] + box["height"] <= pane["y"] + pane["height"] + 1


def test_across_ranks_names_a_few_ranks_per_extreme(ranks_page, job):
    page = ranks_page
    texts = page.eval_on_selector_all("#rank-stats tr", "rs => Object.fromEntries(rs.map(r => [r.dataset.stat, r.cells[4] && r.cells[4].textContent]).filter(x => x[0]))")
    # the bench's dumps carry their calls as events only (module counts 0 on every rank); their
    # times come from the events: the slow rank and the rank that skipped a call are the extremes
    assert texts["seconds"] == f"max rank {job.slow}; min rank {job.skip}"
    for text in texts.values():
        assert len(re.findall(r"\b\d+\b", text.replace("1,023", "N"))) <= 4, text
    assert DURATION.match(page.locator("#total-time").text_content())


def test_the_top_ranks_column_fits_at_1440_px(ranks_page, job):
    page = ranks_page
    head = page.locator("#op-spread thead th", has_text="top ranks")
    wrap = page.locator("#op-spread").locator("xpath=..")
    h, w = head.bounding_box(), wrap.bounding_box()
    assert h["x"] + h["width"] <= min(w["x"] + w["width"], 1440) + 1
    expect(page.locator('#op-spread tr[data-op="all_reduce"] .rank-link').first).to_have_attribute("data-rank", str(job.slow))
