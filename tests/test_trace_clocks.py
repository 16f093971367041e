"""`commdebug trace` on one clock (docs/ranks.md, "One clock for every rank"), on jobs made
here whose true timeline is known: ranks that start hundreds of milliseconds apart, hosts whose
clocks are off by a known amount, dumps from before `start_wall_s`, and times that contradict
each other. The same on a real two-host torchrun job is in tests/test_nodes.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

from commdebug.analysis.clocks import align_clocks, clock_digest
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.render.chrome_trace import ChromeTrace, trace_summary
from commdebug.units import format_duration

WORLD = GroupInfo("0", "default_pg", 4, (0, 1, 2, 3))
EPOCH = 1_795_000_000.0


def job(hosts: dict[int, str], skew: dict[str, float], *, calls: int = 12, exact: bool = True, seed: int = 0,
        op: str = "all_reduce") -> list[RankView]:
    """Ranks whose true timeline is known: rank r starts its recording at EPOCH + 0.1 r (true
    time) and reads the clock of its host, `skew[host]` seconds ahead of true time. Call i:
    each rank arrives at its own moment (some rank last, a different one each time), and every
    rank leaves within 50 us of the moment the last one arrived plus 1 ms."""
    rng = random.Random(seed)
    starts = {r: EPOCH + 0.1 * r for r in hosts}
    events: dict[int, list[CollectiveEvent]] = {r: [] for r in hosts}
    for i in range(calls):
        t = EPOCH + 1.0 + i * 0.05
        arrive = {r: t + rng.uniform(0, 0.02) for r in hosts}
        done = max(arrive.values()) + 0.001
        for r in hosts:
            leave = done + rng.uniform(0, 5e-5)
            events[r].append(CollectiveEvent(i, op, op, f"c10d.{op}", i, "forward", "Global", WORLD, i, "float32", ((8,),), ((8,),),
                                             32, 32, 32, 1.5, latency_s=leave - arrive[r], start_s=arrive[r] - starts[r]))
    views = []
    for r, host in hosts.items():
        own = starts[r] + skew[host]  # its start as its host's clock reads it
        meta = {"rank": r, "world_size": len(hosts), "hostname": host, "start_time": _iso(own)}
        if exact:
            meta["start_wall_s"] = own
        views.append(RankView(r, Path(f"rank{r}.json"), meta, {"0": WORLD}, events[r]))
    return views


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def render(views: list[RankView], tmp_path: Path, align: bool = True) -> tuple[dict, list[str]]:
    clocks = align_clocks(clock_digest(v) for v in views) if align else None
    chrome = ChromeTrace(clocks=clocks)
    out = tmp_path / "trace.json"
    out.write_text("".join(chrome.render(views)))
    return json.loads(out.read_text()), trace_summary(chrome.counts, out, clocks=clocks)


def flow_steps(trace: dict) -> list[float]:
    """Every arrow's step in time, in microseconds (negative: it runs back)."""
    chains: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "t", "f"):
            chains.setdefault(e["id"], []).append(e)
    return [b["ts"] - a["ts"] for points in chains.values() for a, b in zip(points, points[1:], strict=False)]


def test_ranks_of_one_host_that_start_apart_are_put_on_one_clock(tmp_path):
    views = job({0: "a", 1: "a", 2: "a", 3: "a"}, {"a": 0.0})
    before, _ = render(views, tmp_path, align=False)  # each from its own start: the later starters look early
    assert min(flow_steps(before)) < -100_000
    trace, lines = render(views, tmp_path)
    assert min(flow_steps(trace)) >= 0 and len(flow_steps(trace)) == 12 * 3
    assert lines[1] == "clocks: one clock for all ranks: every rank on host a (ranks 0-3), placed by its start time"
    # rank r starts 100 ms after rank 0, as it truly did
    assert [round(trace["metadata"]["commdebug_clocks"]["shift_s"][str(r)], 6) for r in range(4)] == [0.0, 0.1, 0.2, 0.3]


def test_a_hosts_clock_offset_is_found_within_the_printed_bounds(tmp_path):
    views = job({0: "a", 1: "a", 2: "b", 3: "b"}, {"a": 0.0, "b": 0.037})  # host b's clock 37 ms ahead
    trace, lines = render(views, tmp_path)
    clocks = trace["metadata"]["commdebug_clocks"]
    b = clocks["clocks"][1]
    assert (b["host"], b["ranks"], b["calls"]) == ("b", [2, 3], 12)
    assert b["low_s"] <= -0.037 <= b["high_s"] and abs(b["offset_s"] + 0.037) <= b["uncertainty_s"] < 0.005
    assert lines[2].startswith("  host b (ranks 2-3): -3") and lines[2].endswith("(bounded by 12 calls)")
    assert min(flow_steps(trace)) >= -b["uncertainty_s"] * 1e6 - 0.002  # back by no more than the clock's error


def test_dumps_from_before_start_wall_s_make_each_rank_a_clock(tmp_path):
    views = job({0: "a", 1: "a", 2: "b", 3: "b"}, {"a": 0.0, "b": 0.0}, exact=False)
    trace, lines = render(views, tmp_path)
    clocks = trace["metadata"]["commdebug_clocks"]
    assert clocks["per"] == "rank" and [c["ranks"] for c in clocks["clocks"]] == [[0], [1], [2], [3]]
    assert "to the millisecond: a dump from before start_wall_s" in lines[1] and lines[2].startswith("  rank 1 (a): ")
    assert all(c["low_s"] <= c["offset_s"] <= c["high_s"] for c in clocks["clocks"][1:])  # each within its bounds
    assert min(flow_steps(trace)) >= -max(c["uncertainty_s"] for c in clocks["clocks"][1:]) * 1e6 - 0.002


def test_without_wall_clock_starts_each_rank_keeps_its_own(tmp_path):
    views = job({0: "a", 1: "b"}, {"a": 0.0, "b": 0.0})
    for v in views:
        del v.metadata["start_wall_s"], v.metadata["start_time"]
    trace, lines = render(views, tmp_path)
    assert trace["metadata"]["commdebug_clocks"]["method"] == "own starts"
    assert lines[1] == "clocks: not aligned (a dump has no wall-clock start): each rank counts from its own start"


def test_untimed_calls_or_broadcasts_leave_the_start_times_alone(tmp_path):
    views = job({0: "a", 1: "b"}, {"a": 0.0, "b": 0.02}, op="broadcast")  # a broadcast's root may leave first: no bound
    trace, lines = render(views, tmp_path)
    assert trace["metadata"]["commdebug_clocks"]["method"] == "start times" and not flow_steps(trace)
    assert lines[1].startswith("clocks: each rank placed by its start time; no blocking call was timed on two hosts")


def test_calls_timed_on_a_gpu_bound_no_clock_and_the_line_says_why(tmp_path):
    """On NCCL a call's start is the host's issue and its length the kernel's, which may have
    run long after: its span need not hold the moment it finished, so it bounds nothing (a
    bound from it could contradict a true clock and read as a stepped one)."""
    # what the recorder says (metadata.timed_on), and for dumps from before it, a backend naming a GPU one
    for meta in ({"timed_on": ["gpu"]}, {"timed_on": ["gpu", "host"], "backend": "gloo"}, {"backend": "nccl"},
                 {"backend": "cpu:gloo,cuda:nccl"}):
        views = job({0: "a", 1: "a", 2: "b", 3: "b"}, {"a": 0.0, "b": 0.02})
        for v in views:
            v.metadata.update(meta)
        trace, lines = render(views, tmp_path)
        clocks = trace["metadata"]["commdebug_clocks"]
        assert (clocks["method"], clocks["calls"], clocks["gpu_timed_ranks"]) == ("start times", 0, [0, 1, 2, 3]), meta
        assert lines[1] == ("clocks: each rank placed by its start time; no blocking call was timed on two hosts to check or refine "
                            "it (the calls of ranks 0-3 were timed on a GPU (their start is the host's issue, their length the "
                            "kernel's, which may have run later), and such a span does not bound a host's clock)"), lines
    # on the host clock: bounded as before ("undefined" is torch's backend left to the device: nothing says GPU)
    for meta in ({"timed_on": ["host"], "backend": "cpu:gloo,cuda:nccl"}, {"backend": "gloo"}, {"backend": "undefined"}, {}):
        views = job({0: "a", 1: "a", 2: "b", 3: "b"}, {"a": 0.0, "b": 0.02})
        for v in views:
            v.metadata.update(meta)
        clocks = render(views, tmp_path)[0]["metadata"]["commdebug_clocks"]
        assert (clocks["method"], clocks["gpu_timed_ranks"]) == ("calls", []), meta


def test_a_rank_whose_times_contradict_the_others_is_said_and_bounds_no_one_else(tmp_path):
    """A rank whose times are not its clock's (it "finished" calls before others began them)
    leaves no offset that every call allows: it is placed where its calls' ends agree, the trace
    says so, and the other hosts are bounded without it. Many hosts are summed up."""
    hosts = {r: f"h{r:02d}" for r in range(12)}
    views = job(hosts, {h: 0.0 for h in hosts.values()})
    views[5].events = [e._replace(latency_s=e.latency_s / 100) for e in views[5].events]
    trace, lines = render(views, tmp_path)
    clocks = trace["metadata"]["commdebug_clocks"]["clocks"]
    h05 = next(c for c in clocks if c["host"] == "h05")
    assert h05["low_s"] > h05["high_s"] and h05["uncertainty_s"] is None
    assert all(c["low_s"] <= 0.0 <= c["high_s"] for c in clocks[1:] if c["host"] != "h05")  # the true offsets are 0
    assert lines[6].startswith("  host h05 (rank 5): ") and "the calls' bounds disagree by" in lines[6]
    assert [line for line in lines if "disagree" in line] == [lines[6]]
    assert len(lines) == 2 + 8 + 1  # 8 hosts one per line, then the rest summed up
    worst = max(c["uncertainty_s"] for c in clocks[9:])
    assert lines[-1] == f"  ... 3 more hosts, the bounded ones within ± {format_duration(worst)} (the trace's metadata.commdebug_clocks lists every one)"
