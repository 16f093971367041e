"""Exposed time split into waiting and transfer (issue 46): where every member of each call is in
the folder, `overlap` says how much of a rank's exposed communication was waiting for a late peer
(its length there minus the least member's, at the start of its span) and how much the data
moving; the parts add up to the exposed time, per rank and per row, and agree with a brute-force
recount microsecond by microsecond. Where a member is missing, null and one sentence. Synthetic
NCCL traces of several ranks (tests/kineto_synth.py), in process; the CLI once."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from kineto_synth import Call, write_trace

from commdebug.analysis.overlap import overlap_path
from commdebug.render.overlap import render_overlap

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {"0": ("default_pg", [0, 1]), "1": ("pair", [0, 1])}
STEPS = [(1, 0, 1000), (2, 1000, 2000), (3, 2000, 3000)]


def two_ranks(folder: Path) -> Path:
    """Rank 0 comes 400 us early to the first all_reduce (its kernel 100-600, rank 1's 500-600):
    400 us of waiting, 300 us of it exposed (compute runs 0-200 on rank 0)."""
    c0 = [Call("allreduce", "0", cpu=(90, 5), kernel=(100, 500), seq=1), Call("allreduce", "0", cpu=(1090, 5), kernel=(1100, 200), seq=2),
          Call("allreduce", "0", cpu=(2090, 5), kernel=(2100, 100), seq=3)]
    c1 = [Call("allreduce", "0", cpu=(490, 5), kernel=(500, 100), seq=1), Call("allreduce", "0", cpu=(1090, 5), kernel=(1100, 200), seq=2),
          Call("allreduce", "0", cpu=(2090, 5), kernel=(2100, 100), seq=3)]
    write_trace(folder / "rank0.pt.trace.json", 0, 2, GROUPS, STEPS, c0, compute=[(0, 200), (1000, 50)])
    write_trace(folder / "rank1.pt.trace.json", 1, 2, GROUPS, STEPS, c1, compute=[(0, 480), (1000, 50)])
    return folder


def test_a_rank_that_came_early_waited_and_the_rest_is_transfer(tmp_path):
    folder = two_ranks(tmp_path)
    result = overlap_path(folder)
    r0, r1 = result.ranks
    # rank 0: exposed 200-600 (400 us) + 1100-1300 (200 us); waiting 200-500 of the first call
    assert (r0.exposed_s, r0.exposed_wait_s, r0.exposed_transfer_s) == pytest.approx((600e-6, 300e-6, 300e-6), abs=1e-12)
    assert (r1.exposed_s, r1.exposed_wait_s, r1.exposed_transfer_s) == pytest.approx((300e-6, 0.0, 300e-6), abs=1e-12)
    steps = {(r.rank, r.key): r for r in overlap_path(folder, by="step").rows}
    assert (steps[(0, 1)].exposed_wait_s, steps[(0, 1)].exposed_transfer_s) == pytest.approx((300e-6, 100e-6), abs=1e-12)
    assert steps[(0, 2)].exposed_wait_s == 0.0 and steps[(0, 3)].exposed_wait_s == 0.0  # the last step too (outside the window)
    text = render_overlap(result)
    assert "rank    comm  compute  overlapped  exposed  waiting  transfer  overlap  steps" in text
    assert "   0  700 us   250 us      100 us   600 us   300 us    300 us    14.3%    1-3" in text
    assert "waiting: the exposed time the rank spent waiting for the last member of its calls to arrive" in text
    assert "is not known" not in text


@pytest.mark.proc
def test_one_trace_alone_cannot_say_and_says_so_once(tmp_path):
    one = two_ranks(tmp_path) / "rank0.pt.trace.json"
    result = overlap_path(one)
    assert result.ranks[0].exposed_wait_s is None and result.ranks[0].exposed_transfer_s is None
    assert all(r.exposed_wait_s is None for r in result.rows)
    text = render_overlap(result)
    assert "   0  700 us   250 us      100 us   600 us        -         -    14.3%    1-3" in text
    assert text.count("the split of exposed time into waiting and transfer is not known") == 1
    data = json.loads(subprocess.run([sys.executable, "-m", "commdebug", "overlap", str(one), "--json"], capture_output=True,
                                     text=True, cwd=ROOT, timeout=120).stdout)
    assert data["ranks"][0]["exposed_wait_s"] is None and data["rows"][0]["exposed_transfer_s"] is None


def test_a_call_at_the_edge_of_one_ranks_profile_leaves_only_its_rows_unsplit(tmp_path):
    """Rank 1's trace lacks the last call (its profile stopped earlier): that call's rows are not
    split; the rank's whole figures (the last step is outside them) still are."""
    two_ranks(tmp_path)
    c1 = [Call("allreduce", "0", cpu=(490, 5), kernel=(500, 100), seq=1), Call("allreduce", "0", cpu=(1090, 5), kernel=(1100, 200), seq=2)]
    write_trace(tmp_path / "rank1.pt.trace.json", 1, 2, GROUPS, STEPS, c1, compute=[(0, 480), (1000, 50)])
    result = overlap_path(tmp_path, by="step")
    split = {(r.rank, r.key): r.exposed_wait_s for r in result.rows}
    assert split[(0, 3)] is None and split[(0, 1)] == pytest.approx(300e-6, abs=1e-12)
    assert result.ranks[0].exposed_wait_s == pytest.approx(300e-6, abs=1e-12)


def _random_job(folder: Path, seed: int, ranks: int = 3, calls: int = 8) -> dict:
    """`ranks` ranks on one group, `calls` all_reduces each with random arrivals (whole
    microseconds), some overlapping each other on a rank, and random compute: the truth to
    recount, per rank: [(call start, end, least length)], compute spans."""
    rng = random.Random(seed)
    groups = {"0": ("default_pg", list(range(ranks)))}
    truth: dict = {}
    plans = {r: [] for r in range(ranks)}
    t = 50
    for k in range(calls):
        arrive = {r: t + rng.randrange(0, 300) for r in range(ranks)}
        transfer = rng.randrange(20, 200)
        end = max(arrive.values()) + transfer
        for r in range(ranks):
            plans[r].append((arrive[r], end, transfer, k))
        t = end - rng.randrange(0, 150)  # the next call may start before this one ends: overlapping calls
    for r in range(ranks):
        compute = []
        at = 0
        while at < t + 400:
            start, length = at + rng.randrange(0, 80), rng.randrange(10, 120)
            compute.append((start, length))
            at = start + length
        calls_r = [Call("allreduce", "0", cpu=(a - 5, 3), kernel=(a, e - a), seq=k + 1) for a, e, _, k in plans[r]]
        write_trace(folder / f"rank{r}.pt.trace.json", r, ranks, groups, [(1, 0, t + 1000)], calls_r, compute=compute)
        truth[r] = ([(a, e, tr) for a, e, tr, _ in plans[r]], [(s, s + n) for s, n in compute])
    return truth


def _recount(calls: list[tuple[int, int, int]], compute: list[tuple[int, int]]) -> tuple[float, float]:
    """(exposed, exposed waiting) in microseconds, one microsecond at a time: at an instant with
    n calls running and no compute, each call takes 1/n; of a call's share, the part within its
    first (length - least) microseconds is waiting."""
    end = max(e for _, e, _ in calls) + 1
    exposed = waiting = 0.0
    for t in range(end):
        mid = t + 0.5
        if any(s <= mid < e for s, e in compute):
            continue
        running = [(s, e, least) for s, e, least in calls if s <= mid < e]
        for s, e, least in running:
            exposed += 1 / len(running)
            if mid < s + (e - s - least):
                waiting += 1 / len(running)
    return exposed, waiting


@pytest.mark.parametrize("seed", range(4))
def test_the_split_agrees_with_a_recount_microsecond_by_microsecond(tmp_path, seed):
    truth = _random_job(tmp_path, seed)
    result = overlap_path(tmp_path)
    assert [r.rank for r in result.ranks] == sorted(truth)
    for r in result.ranks:
        exposed, waiting = _recount(*truth[r.rank])
        assert r.exposed_s * 1e6 == pytest.approx(exposed, abs=1e-6)
        assert r.exposed_wait_s is not None and r.exposed_wait_s * 1e6 == pytest.approx(waiting, abs=1e-6)
        assert r.exposed_wait_s + r.exposed_transfer_s == pytest.approx(r.exposed_s, abs=1e-15)
        rows = [x for x in result.rows if x.rank == r.rank]
        assert sum(x.exposed_wait_s for x in rows) == pytest.approx(r.exposed_wait_s, abs=1e-12)
        assert all(x.exposed_wait_s + x.exposed_transfer_s == pytest.approx(x.exposed_s, abs=1e-15) for x in rows)
    assert sum(r.exposed_wait_s for r in result.ranks) > 0  # the job made some rank wait


# (module that issues it, FSDP unit whose parameters it moves, op): one step of a two-layer FSDP2
# model with backward prefetch: layers.0's backward all_gather is issued in layers.1's backward
FSDP_STEP = [("M.layers.0", "M.layers.0", "all_gather"), ("M.layers.1", "M.layers.1", "all_gather"),
             ("M.layers.1", "M.layers.0", "all_gather"), ("M.layers.1", "M.layers.1", "reduce_scatter"),
             ("M.layers.0", "M.layers.0", "reduce_scatter")]


def fsdp_folder(folder: Path) -> Path:
    """Two ranks' dumps of FSDP_STEP x 2 steps, each with its profile beside it (an NCCL trace of
    the same calls), as `commdebug run --profile-steps 1-2` writes them; rank 1 comes 200 us late
    to every call."""
    from timeline import write_views

    from commdebug.model.rank_view import RankView
    from commdebug.model.trace import CollectiveEvent, GroupInfo

    group = GroupInfo("0", "default_pg", 2, (0, 1))
    names = {"all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base"}
    views = []
    for r in range(2):
        events, calls = [], []
        for step in (1, 2):
            for k, (module, unit, op) in enumerate(FSDP_STEP):
                seq = len(events)
                start = 1000 + 2500 * (step - 1) + 400 * k
                length = 100 + (0 if r else 200)  # rank 0 waits 200 us in each
                events.append(CollectiveEvent(
                    index=seq, op=op, key=f"c10d.{op}", aten_op=f"c10d.{op}.default", step=step, phase="forward", module=module,
                    group=group, seq=seq, dtype="float32", input_shapes=((1024,),), output_shapes=((1024,),), input_bytes=4096,
                    output_bytes=4096, size_bytes=4096, busbw_factor=0.5, source="train.py:9", latency_s=length * 1e-6,
                    start_s=start * 1e-6, unit=unit))
                calls.append(Call(names[op], "0", cpu=(start - (0 if r else 200) - 5, 3), kernel=(start - (0 if r else 200), length),
                                  seq=seq + 1))
        views.append(RankView(r, Path(f"rank{r}.json"), {"rank": r, "world_size": 2, "timing": "async"}, {"0": group}, events))
        write_trace(folder / f"rank{r}.profile.json.gz", r, 2, {"0": ("default_pg", [0, 1])}, [(1, 700, 3200), (2, 3200, 5700)], calls)
    return write_views(views, folder)


@pytest.mark.proc
def test_by_unit_names_the_unit_whose_parameters_moved_by_module_the_module_that_issued(tmp_path):
    folder = fsdp_folder(tmp_path)
    by_unit = overlap_path(folder, by="unit")
    by_module = overlap_path(folder, by="module")
    assert all(r.joined for r in by_unit.ranks)
    units = {(r.rank, r.key): r.calls for r in by_unit.rows}
    modules = {(r.rank, r.key): r.calls for r in by_module.rows}
    # step 1 (HTA's window): layers.0 moved 3 times (2 gathers, 1 reduce), though it issued 2 of them
    assert units == {(0, "M.layers.0"): 3, (0, "M.layers.1"): 2, (1, "M.layers.0"): 3, (1, "M.layers.1"): 2}
    assert modules == {(0, "M.layers.0"): 2, (0, "M.layers.1"): 3, (1, "M.layers.0"): 2, (1, "M.layers.1"): 3}
    for result in (by_unit, by_module):
        for rank in result.ranks:
            rows = [r for r in result.rows if r.rank == rank.rank]
            assert sum(r.exposed_s for r in rows) == pytest.approx(rank.exposed_s, abs=1e-12)
            assert rank.exposed_wait_s is not None
    # rank 0 came 200 us early to each call: its exposed time is two thirds waiting
    r0 = by_unit.ranks[0]
    assert r0.exposed_wait_s == pytest.approx(5 * 200e-6, abs=1e-9) and r0.exposed_transfer_s == pytest.approx(5 * 100e-6, abs=1e-9)
    assert by_unit.ranks[1].exposed_wait_s == 0.0
    text = render_overlap(by_unit)
    assert "by unit (the rows' exposed time adds up to the rank's" in text and "0     M.layers.0      3" in text
    done = subprocess.run([sys.executable, "-m", "commdebug", "overlap", str(folder), "--by", "unit", "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {(r["rank"], r["unit"]) for r in json.loads(done.stdout)["rows"]} == set(units)


@pytest.mark.proc
def test_by_unit_needs_the_dumps_and_says_so(tmp_path):
    one = two_ranks(tmp_path)
    done = subprocess.run([sys.executable, "-m", "commdebug", "overlap", str(one), "--by", "unit"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "--by unit needs each profile joined to its rank's commdebug dump" in done.stderr
    assert "Traceback" not in done.stderr
