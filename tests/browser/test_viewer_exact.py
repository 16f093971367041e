"""The folder page's figures are exact, and its words are `commdebug check`'s (issue 38), on a
64-rank job whose ranks all differ (bench/ranks_scale.py's, with a slow rank and a rank that
skipped a call): a clicked cell's data-* hold the dump's exact sums, every time shown (the cell,
the hover, the legend, the per-rank panel, the header) is an exact sum rounded once, and each
finding reads as the command line prints it."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from playwright.sync_api import expect
from ranks_job import shared_job

import commdebug
from commdebug.units import format_duration

ROOT = Path(__file__).resolve().parents[2]
HEATMAP = '[data-testid="rank-step-heatmap"]'


def cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=300).stdout


@pytest.fixture(scope="module")
def job(shared_run):
    return shared_job(shared_run, 64)


def latencies(job, rank: int) -> dict[tuple[int, str], list[float]]:
    """A rank's latencies per (step, op), straight from its dump."""
    out: dict[tuple[int, str], list[float]] = defaultdict(list)
    for e in commdebug.load(job.folder / f"rank{rank}.json").events:
        out[(e.step, e.op)].append(e.latency_s)
    return out


def test_a_clicked_cell_holds_the_dumps_exact_sums_and_reads_as_report(ranks_page, job):
    page = ranks_page
    for rank, step in ((job.slow, job.slow_steps[-1]), (job.skip, job.skip_step), (17, 1)):
        page.locator(f'{HEATMAP} .cell[data-rank="{rank}"][data-step="{step}"]').click()
        expect(page.locator("#heatmap-selection h3")).to_contain_text(f"Rank {rank}, step {step}")
        shown = page.eval_on_selector_all('[data-testid="cell-detail"] tbody tr', """rs => Object.fromEntries(rs.map(r =>
            [r.dataset.op, [Number(r.dataset.calls), r.dataset.timeS, r.dataset.timeUs, r.cells[3].textContent]]))""")
        mine = {op: lats for (s, op), lats in latencies(job, rank).items() if s == step}
        assert set(shown) == set(mine), rank
        report = cli("report", str(job.folder), "--ranks", str(rank), "--steps", str(step))
        for op, (calls, time_s, time_us, text) in shown.items():
            exact = math.fsum(mine[op])
            assert calls == len(mine[op]) and float(time_s) == exact and float(time_us) == exact * 1e6, (rank, op, time_s, exact)
            assert text == format_duration(exact), (rank, op, text)
            row = next(line.split() for line in report.splitlines() if line.split()[:1] == [op])
            assert " ".join(row[5:7]) == text, (rank, op, row)  # calls, bytes (a number and its unit), timed, time


def test_the_hover_the_legend_and_the_panels_round_exact_sums_once(ranks_page, job):
    page = ranks_page
    per_step: dict[int, dict[int, float]] = {}
    for rank in range(job.ranks):
        by_step: dict[int, list[float]] = defaultdict(list)
        for (step, _), lats in latencies(job, rank).items():
            by_step[step] += lats
        per_step[rank] = {s: math.fsum(v) for s, v in by_step.items()}
    rank, step = job.slow, job.slow_steps[0]
    page.locator(f'{HEATMAP} .cell[data-rank="{rank}"][data-step="{step}"]').hover()
    expect(page.locator("#heatmap-hover")).to_contain_text(f"rank {rank} · step {step} · time {format_duration(per_step[rank][step])},")
    legend = page.eval_on_selector_all("#heat-legend > span.muted", "els => els.map(e => e.textContent)")
    assert legend[:2] == ["0 s", format_duration(max(t for steps in per_step.values() for t in steps.values()))], legend
    # the header and the per-rank panel: the rank's time over every step (Global, descendants included)
    page.select_option("#rank-select", label=str(rank))
    everything = math.fsum(lat for lats in latencies(job, rank).values() for lat in lats)
    expect(page.locator("#total-time")).to_have_text(format_duration(everything))
    page.locator('#tree li.node[data-fqn="Global"] .name').first.click()
    expect(page.locator(f'#rank-table tr[data-rank="{rank}"] td').last).to_have_text(format_duration(everything))


def test_the_findings_read_as_check_prints_them(ranks_page, job):
    page = ranks_page
    text = cli("check", str(job.folder))
    printed = re.findall(r"^(\d+)\. \[(\w+)\] (.*)\n((?:     .*\n)+)", text, re.M)
    assert printed and any(re.search(r"ranks \d+,\d+-\d+:", sides) for *_, sides in printed), text  # rank ranges: "24,26-31"
    assert any(line.endswith(f"(step {job.skip_step})") for _, _, line, _ in printed), text
    items = page.locator("#findings-list > li.finding")
    expect(items).to_have_count(len(printed))
    for i, (_, kind, line, sides) in enumerate(printed):
        item = items.nth(i)
        expect(item).to_have_attribute("data-kind", kind)
        expect(item.locator(".message")).to_have_text(line)
        assert item.locator(".sides li").all_text_contents() == [s.strip() for s in sides.splitlines()], i
