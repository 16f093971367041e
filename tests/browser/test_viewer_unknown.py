"""The pages say what the command line says, and nothing the data does not (docs/viewer.md): a
median is `commdebug summary`'s and `report`'s; a folder whose calls name no group gets no verdict
(as `commdebug check` exits 2), never "consistent"; a step whose calls were not timed is "not
timed", not "no calls"; a size not known is "?", a group not named "unknown"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect
from test_unknown_values import older_trace

from commdebug.formats.readers import read
from commdebug.model.dump import to_dump_dict
from commdebug.units import format_duration

from synthetic import write_rank_dumps

ROOT = Path(__file__).resolve().parents[2]
HEATMAP = '[data-testid="rank-step-heatmap"]'


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_a_median_on_the_page_is_the_one_summary_and_report_give(viewer, tmp_path):
    out = tmp_path / "two"
    write_rank_dumps(out, ranks=2, layers=1, steps=2, dim=64, ffn=256, vocab=256, tokens=32)
    slow = out / "rank1.json"  # rank 1 twice as slow: the median of two ranks is their mean, not the faster one
    dump = json.loads(slow.read_text())
    columns = dump["commdebug"]["events"]["columns"]
    columns["latency_s"] = [lat * 2 for lat in columns["latency_s"]]
    slow.write_text(json.dumps(dump))
    summary = json.loads(cli("summary", str(out), "--json").stdout)
    report = json.loads(cli("report", str(out), "--json").stdout)
    page = viewer.open_ranks(out)
    for row in summary["rows"]:
        spread = row["per_rank"]["time_s"]
        assert spread["min"] < spread["median"] < spread["max"]
        cells = page.locator(f'#op-spread tr[data-op="{row["op"]}"] td')
        expect(cells.nth(5)).to_have_text(format_duration(spread["median"]))  # min, median, p90, max
    # a module's time across ranks (Global: every call of the rank, as report's comm time)
    median = report["spread"]["comm_time_s"]["median"]
    expect(page.locator('#rank-stats tr[data-stat="seconds"] td').nth(1)).to_have_text(format_duration(median))


def test_a_folder_whose_calls_name_no_group_gets_no_verdict_as_check_says(viewer, tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    for rank in (0, 1):
        (out / f"rank{rank}.pt.trace.json").write_text(older_trace(rank))
    check = cli("check", str(out))
    assert check.returncode == 2, check.stdout + check.stderr
    why = check.stderr.strip().split(f"{out}: ", 1)[1]
    assert why.startswith("nothing to check: the ranks' collectives name no process group (their torch.profiler traces record none)")
    page = viewer.open_ranks(out)
    expect(page.locator("#check-status")).to_have_text("no verdict")
    expect(page.locator("#check-groups")).to_have_text("not recorded")
    expect(page.locator("#check-collectives")).to_have_text("12")  # the ranks' own calls, not the check's 0
    expect(page.locator("#findings .no-verdict")).to_have_text(why)
    expect(page.locator("#findings")).not_to_contain_text("No findings")
    expect(page.locator("#summary")).not_to_contain_text("consistent")


def test_a_step_whose_calls_were_not_timed_says_so_not_no_calls(viewer):
    data = ROOT / "tests" / "data" / "fsdp_profiled"  # steps 1-2 timed by the profile, 0 and 3 not
    calls = sum(1 for e in read(data / "rank0.json").events if e.step == 0)
    page = viewer.open_ranks(data)
    untimed = page.locator(f'{HEATMAP} .cell[data-rank="0"][data-step="0"]')
    assert "unknown" in untimed.get_attribute("class").split()
    untimed.hover()
    expect(page.locator("#heatmap-hover")).to_contain_text(f"rank 0 · step 0 · time not timed ({calls} calls)")
    page.locator(f'{HEATMAP} .cell[data-rank="0"][data-step="1"]').hover()
    expect(page.locator("#heatmap-hover")).not_to_contain_text("not timed")
    expect(page.locator("#heat-legend")).to_contain_text("calls not timed")


@pytest.fixture
def unknown_sizes_dump(tmp_path) -> dict:
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(older_trace(0))
    return json.loads(json.dumps(to_dump_dict(read(trace))))


def test_a_size_not_known_is_a_question_mark_and_a_group_not_named_is_unknown(viewer, unknown_sizes_dump):
    page = viewer.open(unknown_sizes_dump)
    expect(page.locator("#total-bytes")).to_have_text("40.0 KiB (+6 ?)")
    chip = page.locator('#by-op li[data-op="all_to_all"]')
    expect(chip).to_contain_text("?")
    expect(chip).not_to_contain_text("0 B")
    rows = page.eval_on_selector_all("#events tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    heads = page.eval_on_selector_all("#events thead th", "ths => ths.map(t => t.textContent.trim())")
    op, size, group, module = (heads.index(h) for h in ("op", "bytes", "group", "module"))
    unknown = [r for r in rows if r[op] in ("all_reduce", "all_to_all", "mystery_op")]
    assert len(unknown) == 6 and all(r[size] == "?" for r in unknown), unknown
    assert {r[group] for r in rows} == {"unknown"} and {r[module] for r in rows} == {"unknown"}
    barrier = next(r for r in rows if r[op] == "barrier")
    assert barrier[size] == "0 B"  # a true zero stays one
