"""The folder page's exposed communication (issue 37). On a real two-rank gloo job run under
``commdebug run --profile-steps`` (tutorials/programs/13_overlap.py, made by tests/test_overlap.py), the chart has one bar per
(rank, profiled step) carrying ``commdebug overlap --by step --json``'s figures exactly, drawn in
proportion to them, the step outside HTA's window marked; with more ranks than it lists, the most
exposed come first and the rest wait behind "Show all"; a folder without profiles has no chart."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect
from test_overlap import async_profiled

import commdebug
import visualizer
from commdebug.units import format_duration

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 150
SECTION = "#overlap-section"
CHART = '[data-testid="overlap-chart"]'
BARS = f'{CHART} [data-testid="overlap-bar"]'
# each bar's figures as the page carries them, and its drawn width and its parts' widths
READ_BARS = """els => els.map(e => ({rank: Number(e.dataset.rank), step: Number(e.dataset.step),
  exposed: Number(e.dataset.exposedUs), overlapped: Number(e.dataset.overlappedUs), compute: Number(e.dataset.computeUs),
  calls: Number(e.dataset.calls), inWindow: e.dataset.inWindow, title: e.title, width: e.getBoundingClientRect().width,
  wait: e.dataset.waitUs === "" ? null : Number(e.dataset.waitUs),
  parts: [...e.children].map(c => [c.className, c.getBoundingClientRect().width])}))"""


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def profiled(shared_run) -> Path:
    """Two gloo ranks of the tutorial's async model, 4 steps, steps 1-3 profiled: the folder, the
    run's one copy of the job (tests/test_overlap.py reads it too)."""
    return async_profiled(shared_run)


def step_rows(folder: Path) -> list[dict]:
    done = cli("overlap", str(folder), "--by", "step", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["rows"]


def exposed_order(rows: list[dict]) -> list[int]:
    """Ranks, most exposed time (over their steps in HTA's window) first."""
    total: dict[int, float] = {}
    for r in rows:
        total[r["rank"]] = total.get(r["rank"], 0.0) + (r["exposed_s"] if r["in_window"] else 0.0)
    return sorted(total, key=lambda rank: (-total[rank], rank))


@pytest.mark.timeout(DEADLINE_S + 120)
def test_each_bar_is_overlaps_row_for_its_rank_and_step(viewer, profiled):
    page = viewer.open_ranks(profiled)
    expect(page.locator(SECTION)).to_be_visible()
    expect(page.locator(f"{SECTION} h2")).to_contain_text("Exposed communication")
    rows = step_rows(profiled)
    bars = page.eval_on_selector_all(BARS, READ_BARS)
    # one bar per (rank, step): 2 ranks x 3 profiled steps
    assert sorted((b["rank"], b["step"]) for b in bars) == sorted((r["rank"], r["step"]) for r in rows)
    assert len(bars) == len(rows) == 6
    want = {(r["rank"], r["step"]): r for r in rows}
    busiest = max(b["width"] for b in bars)
    most = max(r["compute_s"] + r["exposed_s"] for r in rows)
    for b in bars:
        r = want[(b["rank"], b["step"])]
        # exact, not rounded: the same float as overlap's seconds x 1e6
        assert b["exposed"] == pytest.approx(r["exposed_s"] * 1e6, rel=1e-15, abs=0)
        assert b["overlapped"] == pytest.approx(r["overlap_s"] * 1e6, rel=1e-15, abs=0)
        assert b["compute"] == pytest.approx(r["compute_s"] * 1e6, rel=1e-15, abs=0)
        assert b["calls"] == r["calls"]
        assert b["inWindow"] == ("true" if r["in_window"] else "false")
        # drawn as it says: the parts in proportion, the bar's length the step's busy time on one scale;
        # the exposed part in two shades where its split into waiting and transfer is known
        parts = [r["compute_s"] - r["overlap_s"], r["overlap_s"], r["exposed_s"]]
        classes = ["ov-part ov-compute", "ov-part ov-overlapped", "ov-part ov-exposed"]
        if r["exposed_wait_s"] is None:
            assert b["wait"] is None
        else:
            assert b["wait"] == pytest.approx(r["exposed_wait_s"] * 1e6, rel=1e-15, abs=0)
            parts[2:] = [r["exposed_wait_s"], r["exposed_s"] - r["exposed_wait_s"]]
            classes[2:] = ["ov-part ov-exposed ov-wait", "ov-part ov-exposed ov-transfer"]
            assert f"(waiting {format_duration(r['exposed_wait_s'])}, transfer " in b["title"]
        assert [cls for cls, _ in b["parts"]] == classes
        for (_, width), v in zip(b["parts"], parts, strict=True):
            assert abs(width - b["width"] * v / sum(parts)) < 1, (b, r)
        assert abs(b["width"] - busiest * (r["compute_s"] + r["exposed_s"]) / most) < 1.5, (b, r)
        # the hover title: each figure rounded once, as the text reports print it
        for text in (f"compute only {format_duration(parts[0])}", f"overlapped {format_duration(r['overlap_s'])}",
                     f"exposed {format_duration(r['exposed_s'])}", f"compute {format_duration(r['compute_s'])}",
                     f"in {r['calls']} calls", f"{100 * r['overlap_ratio']:.1f}% of it overlapped"):
            assert text in b["title"], (text, b["title"])
        assert ("outside HTA's window" in b["title"]) == (not r["in_window"])
    # the async model overlaps part of its communication and leaves part exposed; how much, step
    # by step, depends on the machine's load (a loaded run once had a step with none overlapped)
    assert all(b["overlapped"] + b["exposed"] > 0 for b in bars)
    assert sum(b["overlapped"] for b in bars) > 0 and sum(b["exposed"] for b in bars) > 0
    # the last profiled step is outside HTA's window, and marked so
    assert {r["step"] for r in rows if not r["in_window"]} == {3}
    expect(page.locator(f'{CHART} .col-label[data-step="3"]')).to_have_text("step 3*")
    expect(page.locator(f'{CHART} .col-label[data-step="1"]')).to_have_text("step 1")
    assert page.locator(f'{BARS}.outside').count() == 2
    legend = page.locator("#overlap-legend").text_content()
    for words in ("compute only = compute with no communication under it", "overlapped = communication under compute",
                  "exposed = communication not under compute", "* outside HTA's window"):
        assert words in legend
    # both ranks of the job profiled, with their groups: every step's exposed time is split
    assert all(r["exposed_wait_s"] is not None for r in rows)
    assert "waiting = exposed, waiting for a late peer to arrive" in legend and "transfer = exposed, moving the data" in legend
    # the most exposed rank first; a bar's click shows that rank
    assert page.eval_on_selector_all(f"{CHART} .rank-link", "els => els.map(e => Number(e.dataset.rank))") == exposed_order(rows)
    last = exposed_order(rows)[-1]
    page.locator(f'{BARS}[data-rank="{last}"][data-step="2"]').click()
    expect(page.locator("#meta-rank")).to_have_text(str(last))


def test_no_chart_without_profiles_and_a_rank_without_one_is_named(viewer, profiled, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("rank0.json", "rank1.json"):
        shutil.copy(profiled / name, bare / name)
    page = viewer.open_ranks(bare, name="bare.html")
    expect(page.locator("#heatmap-section")).to_be_visible()  # the page is drawn ...
    expect(page.locator(SECTION)).to_be_hidden()  # ... without the section
    assert page.locator(CHART).count() == 0
    assert "overlap" not in visualizer.ranks_data(bare)[0]
    # rank 1's profile only: rank 1 charted, rank 0 said to have none
    shutil.copy(profiled / "rank1.profile.json.gz", bare / "rank1.profile.json.gz")
    page = viewer.open_ranks(bare, name="half.html")
    expect(page.locator(SECTION)).to_be_visible()
    assert sorted({b["rank"] for b in page.eval_on_selector_all(BARS, READ_BARS)}) == [1]
    expect(page.locator("#overlap-note")).to_contain_text("rank 0: no profile (record with commdebug run --profile-steps)")
    # rank 0's calls are not known, so how long rank 1 waited for it is not either: one shade, and said
    expect(page.locator("#overlap-note")).to_contain_text("rank 1: exposed time not split into waiting and transfer")
    assert page.locator(f"{CHART} .ov-wait").count() == 0
    # one rank's dump opened on the folder page: the folder's chart goes with the folder
    page.set_input_files("#file-input", str(bare / "rank0.json"))
    expect(page.locator("#events")).to_be_visible()
    expect(page.locator(SECTION)).to_be_hidden()


def test_view_steps_keeps_those_steps_bars(page, profiled, tmp_path):
    out = tmp_path / "step2.html"
    done = cli("view", str(profiled), "--steps", "2", "-o", str(out))
    assert done.returncode == 0, done.stderr
    page.goto(out.as_uri())
    page.wait_for_selector("body:not([data-state=loading])", state="attached")
    want = {(r["rank"], r["step"]): r["exposed_s"] for r in step_rows(profiled) if r["step"] == 2}
    bars = page.eval_on_selector_all(BARS, READ_BARS)
    assert {(b["rank"], b["step"]): b["exposed"] for b in bars} == pytest.approx({k: v * 1e6 for k, v in want.items()}, rel=1e-15)
    assert len(bars) == 2
    expect(page.locator("#overlap-note")).to_contain_text("Steps 2 only (--steps).")


def many_ranks(folder: Path, profiled_ranks: int = 40, bare: int = 2) -> commdebug.FolderModules:
    """The job's folder as `profiled_ranks` profiled ranks (each the first rank's steps, its
    exposed time scaled by its own factor, so no two agree) and `bare` ranks without a profile."""
    found = commdebug.rank_modules(folder)
    first = found.ranks[0]
    ranks = []
    for k in range(profiled_ranks + bare):
        factor = (7 * k) % profiled_ranks + 1  # most exposed: not the highest rank numbers
        rows = None if k >= profiled_ranks else [dataclasses.replace(o, rank=k, exposed_s=o.exposed_s * factor) for o in first.overlap]
        ranks.append(dataclasses.replace(first, rank=k, overlap=rows))
    return dataclasses.replace(found, ranks=ranks)


@pytest.mark.timeout(DEADLINE_S + 120)
def test_many_ranks_most_exposed_first_the_rest_behind_show_all(viewer, profiled):
    found = many_ranks(profiled)
    rows = [{"rank": o.rank, "step": o.key, "exposed_s": o.exposed_s, "in_window": o.in_window}
            for r in found.ranks for o in r.overlap or ()]
    page = viewer.open_ranks(found, name="many.html")
    links = f"{CHART} .rank-link"
    shown = page.eval_on_selector_all(links, "els => els.map(e => Number(e.dataset.rank))")
    assert shown == exposed_order(rows)[:16]
    assert page.locator(BARS).count() == 16 * 3
    note = page.locator("#overlap-note")
    expect(note).to_contain_text("The 16 of 40 profiled ranks with the most exposed time shown.")
    expect(note).to_contain_text("ranks 40, 41: no profile")
    one = f'{BARS}[data-rank="{shown[-1]}"][data-step="1"]'
    width = page.locator(one).bounding_box()["width"]
    page.click("#overlap-all")
    expect(page.locator(links)).to_have_count(40)
    assert page.eval_on_selector_all(links, "els => els.map(e => Number(e.dataset.rank))") == exposed_order(rows)
    bars = page.eval_on_selector_all(BARS, READ_BARS)
    want = {(r["rank"], r["step"]): r["exposed_s"] for r in rows}
    assert {(b["rank"], b["step"]) for b in bars} == set(want) and len(bars) == 40 * 3
    assert all(b["exposed"] == pytest.approx(want[(b["rank"], b["step"])] * 1e6, rel=1e-15, abs=0) for b in bars)
    assert page.locator(one).bounding_box()["width"] == pytest.approx(width, abs=0.5)  # one scale, shown or not
    expect(page.locator("#overlap-all")).to_have_text("Show the 16 with most exposed time")
    page.click("#overlap-all")
    expect(page.locator(links)).to_have_count(16)


def test_past_the_row_limit_the_least_exposed_ranks_are_left_out_and_said(viewer, profiled, monkeypatch):
    found = many_ranks(profiled, profiled_ranks=12, bare=0)
    monkeypatch.setattr(visualizer, "OVERLAP_ROWS", 30)  # 10 ranks of 3 steps
    order = exposed_order([{"rank": o.rank, "exposed_s": o.exposed_s, "in_window": o.in_window}
                           for r in found.ranks for o in r.overlap or ()])
    page = viewer.open_ranks(found, name="limited.html")
    shown = page.eval_on_selector_all(f"{CHART} .rank-link", "els => els.map(e => Number(e.dataset.rank))")
    assert shown == order[:10]
    left = sorted(order[10:])
    expect(page.locator("#overlap-note")).to_contain_text(
        f"ranks {left[0]}, {left[1]} with the least exposed time are not in the page (at most 30 rank and step bars are embedded)")


def test_a_thousand_profiled_ranks_add_little_to_the_page(profiled):
    """1,024 profiled ranks x 3 steps: every bar embedded, its exposed time's waiting part too, in
    under a quarter of a MiB."""
    found = many_ranks(profiled, profiled_ranks=1024, bare=0)
    index, blocks = visualizer.ranks_data(found)
    block = blocks[index["overlap"]["block"]]
    assert index["overlap"]["left_out"] == [] and sum(len(r) for r in json.loads(block)) == 1024 * 3 * 7
    assert len(block) < 250_000, len(block)
