"""Issue 19 on the command line: `trace --ranks/--steps`, gzip output, flow arrows between the
ranks' calls of one collective (on a real timed gloo job), `report --top`, `view --ranks`, bad
selections, and the progress line that only a terminal gets."""

from __future__ import annotations

import gzip
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commdebug.ops import needs_all

from chrome_trace_rules import validate_chrome_trace
from synthetic import write_rank_dumps

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"dim": 64, "ffn": 256, "vocab": 256, "tokens": 32}


def cli(*args: str) -> subprocess.CompletedProcess:
    """`commdebug ARGS` in this process (a fresh one per call would import torch each time):
    its exit status, stdout and stderr."""
    import contextlib
    import io

    from commdebug.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as e:  # argparse's own usage errors
            status = e.code
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """4 synthetic ranks x 3 steps, timed; rank 3 twice as slow at step 2."""
    out = tmp_path_factory.mktemp("job4")
    write_rank_dumps(out, ranks=4, layers=1, steps=3, **SMALL)
    dump = json.loads((out / "rank3.json").read_text())
    cols = dump["commdebug"]["events"]["columns"]
    cols["latency_s"] = [lat * 2 if s == 2 else lat for lat, s in zip(cols["latency_s"], cols["step"], strict=True)]
    (out / "rank3.json").write_text(json.dumps(dump))
    return out


def trace_of(job: Path, out: Path, *options: str) -> tuple[list[dict], str]:
    proc = cli("trace", str(job), "-o", str(out), *options)
    assert proc.returncode == 0, proc.stderr
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "rt", encoding="utf-8") as f:
        return validate_chrome_trace(json.load(f)), proc.stdout


@pytest.mark.proc
def test_ranks_and_steps_keep_only_those_pids_and_steps(job, tmp_path):
    events, stdout = trace_of(job, tmp_path / "t.json", "--ranks", "0-1", "--steps", "1-1")
    assert {e["pid"] for e in events} == {0, 1}
    calls = [e for e in events if e.get("cat") == "collective" and e["ph"] in "Xi"]
    assert calls and {e["args"]["step"] for e in calls} == {1}
    assert [e["args"]["step"] for e in events if e.get("cat") == "step"] == [1, 1]
    full, _ = trace_of(job, tmp_path / "all.json")
    per_rank_step = sum(1 for e in full if e.get("cat") == "collective" and e["ph"] in "Xi" and e["pid"] == 0 and e["args"]["step"] == 1)
    assert len(calls) == 2 * per_rank_step
    # the summary says what was written and why the rest was left out
    first, clocks, *per_rank, second = stdout.splitlines()
    assert clocks.startswith("clocks: one clock for all ranks: each rank placed by its start time")  # how they were aligned
    assert [line.split(":")[0] for line in per_rank] == ["  rank 1 (synthetic-node0)"]  # the other rank on its own clock
    assert first.startswith(f"wrote {tmp_path / 't.json'}: 2 ranks, {len(calls)} timed collectives")
    left = sum(1 for e in full if e.get("cat") == "collective" and e["ph"] in "Xi" and e["pid"] in (0, 1)) - len(calls)
    assert second == f"left out: 2 of 4 ranks (not in --ranks 0-1); {left} calls outside --steps 1"


@pytest.mark.proc
def test_gzip_output_is_a_valid_trace(job, tmp_path):
    out = tmp_path / "x.json.gz"
    events, stdout = trace_of(job, out, "--ranks", "2")
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic
    assert {e["pid"] for e in events} == {2} and stdout.startswith(f"wrote {out}: 1 rank, ")
    plain, _ = trace_of(job, tmp_path / "x.json", "--ranks", "2")
    assert events == plain
    assert out.stat().st_size * 4 < (tmp_path / "x.json").stat().st_size


@pytest.mark.proc
def test_flows_join_the_ranks_of_each_call_unless_left_out(job, tmp_path):
    events, stdout = trace_of(job, tmp_path / "t.json")
    flows = [e for e in events if e["ph"] in ("s", "t", "f")]
    chains = {e["id"] for e in flows}
    calls = {(e["args"]["group"], e["args"]["seq"]) for e in events if e["ph"] == "X" and e.get("cat") == "collective"}
    assert len(chains) == len(calls)  # one group of 4 ranks: every call is seen on all of them
    assert all(sorted(e["ph"] for e in flows if e["id"] == i) == ["f", "s", "t", "t"] for i in chains)
    assert f"{len(chains)} flows joining the ranks of one call" in stdout
    bare, _ = trace_of(job, tmp_path / "bare.json", "--no-flows")
    assert not any(e["ph"] in ("s", "t", "f") for e in bare)
    assert [e for e in events if e["ph"] not in ("s", "t", "f")] == bare


@pytest.mark.proc
@pytest.mark.parametrize("option, value, message", [
    ("--ranks", "0-x", "--ranks: '0-x' is not a number >= 0 or a range like 0-7 (in '0-x')"),
    ("--ranks", "3-1", "--ranks: range '3-1' ends before it starts (write 1-3)"),
    ("--steps", "", "--steps: expected numbers and ranges like 0-7,512, not ''"),
    ("--steps", "1,,2", "--steps: expected numbers and ranges like 0-7,512, not '1,,2'"),
])
@pytest.mark.parametrize("verb", ["trace", "report", "view"])
def test_bad_selections_exit_2_with_one_line(job, tmp_path, verb, option, value, message):
    out = tmp_path / "keep.out"
    out.write_text("keep me")
    proc = cli(verb, str(job), option, value, *(["-o", str(out)] if verb != "report" else []))
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"commdebug: error: {message}\n", "")
    assert out.read_text() == "keep me"


@pytest.mark.proc
def test_a_selection_of_no_rank_is_an_error(job, tmp_path):
    for verb in ("trace", "report", "view"):
        proc = cli(verb, str(job), "--ranks", "7-9", "-o", str(tmp_path / "x")) if verb != "report" else cli(verb, str(job), "--ranks", "7-9")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no rank in --ranks 7-9" in proc.stderr, (verb, proc.stderr)
    one = cli("view", str(job / "rank0.json"), "--ranks", "0", "-o", str(tmp_path / "x.html"))
    assert one.returncode == 2 and one.stderr.startswith("commdebug: error: --ranks and --steps choose from a folder")


@pytest.mark.proc
def test_report_top_lists_the_ranks_furthest_from_the_median(job, tmp_path):
    every = cli("report", str(job))
    assert every.returncode == 0 and "deviation" not in every.stdout  # all ranks below 64
    top = cli("report", str(job), "--top", "1")
    assert top.returncode == 0, top.stderr
    lines = top.stdout.splitlines()
    assert lines[1] == "ranks: the 1 of 4 furthest from the median (--top K to change, --top 0 for all)"
    table = lines[lines.index("") + 1:]
    assert "deviation" in table[0].split() and table[1].split()[0] == "3"  # the slow rank
    assert table[2].startswith("min")
    data = json.loads(cli("report", str(job), "--top", "1", "--json").stdout)
    assert [r["rank"] for r in data["ranks"]] == [3] and data["ranks_total"] == 4
    deviation = data["ranks"][0]["deviation"]
    assert deviation["figure"] in ("comm_time_s", "straggler_s") and deviation["relative"] > 0.1
    assert cli("report", str(job), "--top", "-1").returncode == 2


def test_report_of_64_ranks_lists_16_by_default(tmp_path):
    write_rank_dumps(tmp_path / "wide", ranks=64, layers=0, steps=1, **SMALL)
    text = cli("report", str(tmp_path / "wide")).stdout
    assert "ranks: the 16 of 64 furthest from the median" in text
    everything = cli("report", str(tmp_path / "wide"), "--top", "0").stdout
    assert "furthest" not in everything and len(everything.splitlines()) > len(text.splitlines()) + 40


@pytest.mark.proc
def test_view_ranks_and_steps_cut_the_page(job, tmp_path):
    proc = cli("view", str(job), "--ranks", "1-2", "--steps", "0,2", "-o", str(tmp_path / "p.html"))
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "p.html").read_text()
    assert '"file":"rank1.json"' in html and '"file":"rank2.json"' in html and '"file":"rank0.json"' not in html
    assert '"steps":[0,2]' in html and '"chosen":{"ranks":"1-2","steps":"0,2","ranks_left_out":2}' in html


def _on_a_terminal(*args: str, deadline_s: float = 60) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout a pipe); (status, what the terminal got)."""
    main, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "commdebug", *args], stdout=subprocess.PIPE, stderr=side, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(side)
    got = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    proc.communicate(timeout=deadline_s)
    os.close(main)
    return proc.returncode, got.decode("utf-8", "replace")


@pytest.mark.proc
def test_progress_goes_to_a_terminal_only(job, tmp_path):
    status, seen = _on_a_terminal("check", str(job))
    assert status == 0
    assert "ranks read 4/4 (100%" in seen and seen.endswith("\r\x1b[K")  # drawn in place, then cleared
    status, seen = _on_a_terminal("check", str(job), "--quiet")
    assert status == 0 and seen == ""
    piped = cli("check", str(job))  # stderr a pipe: scripts see what they saw before
    assert piped.returncode == 0 and piped.stderr == ""
    for verb in (["report", str(job)], ["trace", str(job), "-o", str(tmp_path / "t.json")],
                 ["view", str(job), "-o", str(tmp_path / "v.html")], ["summary", str(job)], ["diff", str(job), str(job)]):
        status, seen = _on_a_terminal(*verb)
        assert status == 0 and "ranks read 4/4" in seen, verb


# ------------------------------------------------------------------ a real timed gloo job

DEADLINE_S = 150


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory) -> Path:
    """2 gloo ranks of tests/programs/job.py under torchrun and `commdebug run --timing`."""
    cwd = tmp_path_factory.mktemp("gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--out", "traces", "--timing", "--", str(ROOT / "tests" / "programs" / "job.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=DEADLINE_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd / "traces"


@pytest.mark.proc
@pytest.mark.timeout(2 * DEADLINE_S)
def test_flows_of_a_timed_gloo_run_join_the_same_group_and_seq_on_both_ranks(gloo_job, tmp_path):
    events, stdout = trace_of(gloo_job, tmp_path / "t.json.gz")
    spans = [e for e in events if e["ph"] == "X" and e.get("cat") == "collective"]

    def call_at(point: dict) -> dict:
        [call] = [e for e in spans if (e["pid"], e["tid"]) == (point["pid"], point["tid"])
                  and e["ts"] <= point["ts"] <= e["ts"] + e["dur"]]
        return call

    chains: dict[int, list[dict]] = {}
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            chains.setdefault(e["id"], []).append(e)
    # every timed call of an op no member finishes before all joined, once (a broadcast's root may leave first)
    timed = {(e["args"]["group"], e["args"]["seq"]) for e in spans if "seq" in e["args"] and needs_all(e["name"])}
    assert chains and len(chains) == len(timed) and len(timed) < len({(e["args"]["group"], e["args"].get("seq")) for e in spans})
    for points in chains.values():
        assert sorted(p["ph"] for p in points) == ["f", "s"]
        start, finish = sorted(points, key=lambda p: p["ph"] != "s")
        a, b = call_at(start), call_at(finish)
        assert {start["pid"], finish["pid"]} == {0, 1}
        assert (a["args"]["group"], a["args"]["seq"], a["name"]) == (b["args"]["group"], b["args"]["seq"], b["name"])
        assert a["dur"] >= b["dur"]  # from the rank that arrived first (it waited longest) to the last
    assert f"{len(chains)} flows" in stdout


def test_trace_says_which_calls_of_the_chosen_steps_exist_only_as_totals():
    """A --keep-steps run keeps older steps as totals: a trace of those steps has no events,
    and its summary says why instead of only "outside --steps"."""
    from commdebug.formats.selection import selections
    from commdebug.model.aggregates import Aggregates, set_older
    from commdebug.model.rank_view import RankView
    from commdebug.model.trace import CollectiveEvent, GroupInfo
    from commdebug.render.chrome_trace import ChromeTrace, trace_summary

    group = GroupInfo("0", "default_pg", 2, (0, 1))

    def call(i: int, step: int) -> CollectiveEvent:
        return CollectiveEvent(i, "all_reduce", "c10d.allreduce_", "c10d.allreduce_.default", step, "forward", "Global", group,
                               i, "float32", ((4,),), ((4,),), 16, 16, 16, 1.0, start_s=0.1 * i, latency_s=0.01)

    older = Aggregates()
    for i in range(6):  # steps 0-2, two calls each, folded into totals
        older.add(call(i, i // 2))
    view = RankView(0, Path("rank0.json"), {"rank": 0}, {"0": group}, [call(6, 3), call(7, 3)])
    set_older(view, older)
    _, steps = selections(None, "1-2")
    chrome = ChromeTrace(steps=steps)
    "".join(chrome.render([view]))
    assert chrome.counts["complete"] == 0 and chrome.counts["totals_only"] == 4
    assert trace_summary(chrome.counts, "t.json", steps="1-2")[1] == (
        "left out: 2 calls outside --steps 1-2; 4 calls of older steps kept as totals only (keep_steps, max_events)")
