"""Issue 32 at job scale: 64- and 1,024-rank folders written the way bench/ranks_scale.py writes
them, with a slow rank and a rank that skipped a call planted. Every figure the folder page
embeds is that rank's own, `report` names the slow rank's slow steps, totals over a folder say
they are summed, and durations print to 3 significant digits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ranks_job import shared_job
from test_ranks_page import Page, own_figures

from commdebug.analysis.report import report_path

ROOT = Path(__file__).resolve().parents[1]
# a duration as the text reports print it: 3 significant digits and a unit ("1234 s" past 1,000 s)
DURATION = re.compile(r"(?<![\w.+-])(\d+(?:\.\d+)?) (s|ms|us|ns)\b")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def job64(shared_run):
    return shared_job(shared_run, 64)


@pytest.fixture(scope="module")
def job1024(shared_run):
    return shared_job(shared_run, 1024)


@pytest.mark.proc
@pytest.mark.parametrize("which", ["job64", "job1024"])
def test_every_rank_on_the_page_has_its_own_figures(which, request):
    job = request.getfixturevalue(which)
    page = Page(job.folder)
    entries = page.index["ranks"]
    assert len(entries) == job.ranks
    for i, entry in enumerate(entries):
        own = own_figures(job.folder / entry["file"])
        assert (entry["collectives"], entry["bytes"], entry["seconds"]) == (own["collectives"], own["bytes"], own["seconds"]), entry["rank"]
        assert page.cells(entry) == own["cells"], entry["rank"]  # exact: each (step, op)'s time the exact sum of its latencies
        assert page.matrix_row("step_time", i) == [own["steps"][step] for step in page.steps], entry["rank"]
        assert page.matrix_row("op_time", i) == [own["ops"][op] for op in page.ops], entry["rank"]


def sig_digits(number: str) -> int:
    return len(number.replace(".", "").lstrip("0")) if "." in number or len(number) <= 3 else 3


def assert_durations_3_digits(text: str) -> int:
    found = DURATION.findall(text)
    for number, _ in found:
        if number != "0" and float(number) < 1000:
            assert sig_digits(number) == 3, (number, text)
    return len(found)


@pytest.mark.proc
def test_report_names_the_slow_ranks_slow_steps(job1024):
    rep = report_path(job1024.folder)
    first, deviation = rep.top(1)[0]
    # its own time is 5x on those steps, and so is its time beyond the fastest rank's per call
    assert first.rank == job1024.slow and deviation.figure in ("comm_time_s", "straggler_s")
    # worst first: the slow steps, then (latencies jitter) maybe a step a few microseconds over
    worst = first.worst_steps[:len(job1024.slow_steps)]
    assert sorted(w.step for w in worst) == sorted(job1024.slow_steps)
    assert all(w.excess_s > 100 * v.excess_s for w in worst for v in first.worst_steps[len(worst):])
    assert all(w.excess_s > 0 for w in first.worst_steps)
    assert first.worst_steps == sorted(first.worst_steps, key=lambda w: -w.excess_s)  # worst first

    data = json.loads(cli("report", str(job1024.folder), "--top", "5", "--json").stdout)
    row = data["ranks"][0]
    assert row["rank"] == job1024.slow
    assert [w["step"] for w in row["worst_steps"]] == [w.step for w in first.worst_steps]
    assert all(set(w) == {"step", "excess_s"} for r in data["ranks"] for w in r["worst_steps"])

    text = cli("report", str(job1024.folder), "--top", "5").stdout
    line = next(x for x in text.splitlines() if x.split()[:1] == [str(job1024.slow)])
    for w in first.worst_steps:
        assert re.search(rf"\b{w.step} \+\d", line), line
    assert "per op, summed over 1,024 ranks:" in text
    assert assert_durations_3_digits(text) > 10


@pytest.mark.proc
def test_folder_totals_say_they_are_summed(job1024):
    text = cli("summary", str(job1024.folder)).stdout
    header = text.splitlines()[1]
    assert re.search(r"communication \S+ \S+ summed over 1,024 ranks \(\S+ \S+ per rank\)", header), header
    assert assert_durations_3_digits(text) > 5
