"""Mixture-of-Experts traffic: all_to_all splits recorded (full and light capture, every way to
call the op), stored compactly in the dump, checked pair by pair by ``commdebug check``, and
shown per (group, src, dst) by ``commdebug summary --by peer``; on real gloo ranks and on
per-rank processes of torch's fake backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import commdebug
from commdebug import CommDebugMode
from commdebug.model.events import EVEN, decode_events, encode_events
from commdebug.model.stream import chunk_line, header_line, parse_stream
from commdebug.model.trace import CollectiveEvent, GroupInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from ports import free_port  # noqa: E402  (the one way to find free ports: bench/ports.py)

MOE = ROOT / "tests" / "programs" / "moe_job.py"
DEADLINE_S = 120
DONE = "moe job done rank"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _launch(out: Path, world: int, extra: list[str] | None = None, fake: bool = False) -> list[str]:
    """The MoE program on `world` ranks, one process each (gloo, or the fake backend); returns
    each rank's stdout. A rank counts as finished once it printed its completion marker (after
    writing its dump): gloo in torch 2.13 sometimes aborts a finished uneven all_to_all_single
    program at teardown (SIGABRT, exit -6, after all its output is written), which is torch's,
    not ours, so that exit is accepted there and only there; any other failure fails the test."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
        cmd = [sys.executable, str(MOE), str(out)] + (["--fake", str(rank), str(world)] if fake else []) + (extra or [])
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    deadline = time.monotonic() + DEADLINE_S
    outputs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            finished = DONE in stdout
            aborted_after = finished and p.returncode == -6 and not fake
            assert p.returncode == 0 or aborted_after, f"rank exited {p.returncode}:\n{stdout}\n{stderr[-3000:]}"
            assert finished, f"no completion marker:\n{stdout}\n{stderr[-3000:]}"
            outputs.append(stdout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(f.name for f in out.glob("rank*.json")) == sorted(f"rank{r}.json" for r in range(world))
    return outputs


def _passed(outputs: list[str]) -> list[dict]:
    return [json.loads(next(line for line in o.splitlines() if line.startswith("passed "))[len("passed "):]) for o in outputs]


def _expected_rows(passed: list[dict]) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], int]]:
    """(src, dst) -> [calls, bytes] from what each rank passed as its input splits (the tokens),
    plus each step's exchange of the counts (one int64 per member), and each rank's received
    bytes per source from its output splits."""
    sent: dict[tuple[int, int], list[int]] = {}
    received: Counter = Counter()
    for p in passed:
        world, rank = p["world"], p["rank"]
        steps = {c["step"] for c in p["calls"]}
        for j in range(world):
            sent[(rank, j)] = [len(steps), len(steps) * p["counts_bytes"]]
            received[(j, rank)] += len(steps) * p["counts_bytes"]
        for c in p["calls"]:
            for j, tokens in enumerate(c["input_split_sizes"]):
                sent[(rank, j)][0] += 1
                sent[(rank, j)][1] += tokens * p["token_bytes"]
            for j, tokens in enumerate(c["output_split_sizes"]):
                received[(j, rank)] += tokens * p["token_bytes"]
    return sent, dict(received)


def _peer_rows(path: Path) -> dict[tuple[int, int], list[int]]:
    done = cli("summary", str(path), "--by", "peer", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert {r["group"] for r in rows} == {f"default_pg[{len({r['src'] for r in rows} | {r['dst'] for r in rows})}]"}
    return {(r["src"], r["dst"]): [r["calls"], r["bytes"]] for r in rows}


@pytest.mark.proc
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.timeout(DEADLINE_S + 60)
def test_gloo_moe_with_uneven_splits_is_consistent_and_its_peer_rows_are_the_splits_passed(world, tmp_path):
    outputs = _launch(tmp_path, world)
    done = cli("check", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"consistent: {world} ranks")
    sent, received = _expected_rows(_passed(outputs))
    assert any(len({b for (s, _), (_, b) in sent.items() if s == r}) > 1 for r in range(world))  # really uneven
    assert _peer_rows(tmp_path) == sent
    # one rank's dump alone: its sends and what it received, per source
    one = _peer_rows(tmp_path / "rank1.json")
    assert {k: v for k, v in one.items() if k[0] == 1} == {k: v for k, v in sent.items() if k[0] == 1}
    assert {k: v[1] for k, v in one.items() if k[1] == 1} == {k: v for k, v in received.items() if k[1] == 1}
    # eager and functional forms both recorded, with their splits
    trace = commdebug.load(tmp_path / "rank0.json")
    kinds = Counter(e.aten_op.split(".")[0] for e in trace.events if e.send_splits is not None)
    assert kinds == {"c10d": 3, "_c10d_functional": 5}, kinds  # step 0 eager; step 1 functional, backward too
    assert all(e.recv_splits is not None and sum(e.recv_splits) == e.output_bytes for e in trace.events)


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_split_bookkeeping_bug_on_fake_ranks_is_named_pair_by_pair(tmp_path):
    # rank 0 expects one token (16 B) more from rank 3 than rank 3 sends, in step 1's dispatch
    _launch(tmp_path, 4, ["--bad", "3:0"], fake=True)
    done = cli("check", str(tmp_path), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    findings = json.loads(done.stdout)["findings"]
    assert {f["kind"] for f in findings} == {"all_to_all"}
    first = findings[0]
    sent, received = (3 * 3 + 5 * 0 + 2) % 7 * 16, ((3 * 3 + 5 * 0 + 2) % 7 + 1) * 16
    assert (first["step"], first["odd_ranks"]) == (1, [3, 0])
    assert [(s["ranks"], s["size_bytes"], s["to_rank"], s["from_rank"]) for s in first["sides"]] == [([3], sent, 0, None), ([0], received, None, 3)]
    assert all(s["source"].endswith("moe_job.py:77") and s["module"] == "Global" for s in first["sides"])
    text = cli("check", str(tmp_path)).stdout
    assert f"rank 3 sends {sent} B to rank 0, but rank 0 receives {received} B from rank 3 (step 1)" in text
    # sizes differ between ranks at every all_to_all: never a mismatch
    assert "[mismatch]" not in text


def _event(index: int, group: GroupInfo, send: tuple[int, ...] | None, recv: tuple[int, ...] | None) -> CollectiveEvent:
    total_in, total_out = sum(send or ()), sum(recv or ())
    return CollectiveEvent(index, "all_to_all", "c10d.alltoall_base_", "c10d.alltoall_base_.default", 0, "forward", "Global",
                           group, index, "float32", ((total_in // 16, 4),), ((total_out // 16, 4),), total_in, total_out,
                           total_in, 0.75, send_splits=send, recv_splits=recv)


def test_splits_round_trip_through_the_dump_even_interned_and_old(tmp_path):
    g = GroupInfo("0", "default_pg", 4, (0, 1, 2, 3))
    uneven = (8192, 0, 16384, 8192)
    events = [_event(0, g, (256,) * 4, (256,) * 4), _event(1, g, uneven, (0, 0, 0, 32768)), _event(2, g, (32768, 0, 0, 0), uneven),
              _event(3, g, None, None)]
    block = json.loads(json.dumps(encode_events(events)))
    cols = block["columns"]
    assert cols["send_splits"] == [EVEN, 0, 2, None] and cols["recv_splits"] == [EVEN, 1, 0, None]
    assert block["splits"] == [[8192, 1, 0, 2, 1], [32768, 0, 0, 0, 1], [32768, 1, 0, 0, 0]]  # each vector once
    decoded = decode_events(block, {"0": g})
    assert decoded == events
    assert decoded[1].send_splits is decoded[2].recv_splits  # one tuple for the shared vector
    # no all_to_all: no split columns at all; a dump from before the columns reads as None
    plain = encode_events([events[3]])
    assert "send_splits" not in plain["columns"] and "splits" not in plain
    old = json.loads(json.dumps(encode_events(events)))
    for name in ("send_splits", "recv_splits"):
        del old["columns"][name]
    del old["splits"]
    assert [(e.send_splits, e.recv_splits) for e in decode_events(old, {"0": g})] == [(None, None)] * 4
    # the stream: two chunks, each with its own table, merged
    path = tmp_path / "rank0.jsonl"
    path.write_text(header_line({"rank": 0}, 2, 0.0) + chunk_line(events[:2], time=1.0, step=0, events_total=2)
                    + chunk_line(events[2:], time=2.0, step=0, events_total=4))
    streamed = parse_stream(path.read_bytes(), str(path)).events
    assert [(e.send_splits, e.recv_splits) for e in streamed] == [(e.send_splits, e.recv_splits) for e in events]


@pytest.mark.parametrize("light", [False, True])
def test_every_way_to_call_all_to_all_records_its_splits(world, light, tmp_path):
    n = world
    x = torch.randn(sum(range(n)), 4)  # member j gets j rows, and sends j % 3 + 1
    send, recv = list(range(n)), [j % 3 + 1 for j in range(n)]
    row = 4 * 4
    with CommDebugMode(light=light) as comm:
        dist.all_to_all_single(torch.empty(sum(recv), 4), x, output_split_sizes=recv, input_split_sizes=send)
        dist.all_to_all_single(torch.empty(n, 4), torch.randn(n, 4))
        fc.wait_tensor(fc.all_to_all_single(x, recv, send, dist.group.WORLD))
        fc.wait_tensor(fc.all_to_all_single_autograd(x.clone().requires_grad_(), recv, send, dist.group.WORLD))
        dist.all_to_all([torch.empty(j + 1, 4) for j in range(n)], [torch.randn(j + 1, 4) for j in range(n)])
        torch.ops._dtensor.shard_dim_alltoall(torch.randn(n, 8), 0, 1, dist.group.WORLD.group_name)
        dist.all_reduce(torch.ones(4))
    got = [(e.aten_op.split(".")[0], e.send_splits, e.recv_splits) for e in comm.trace.events]
    uneven = (tuple(j * row for j in send), tuple(r * row for r in recv))
    assert got == [
        ("c10d", *uneven),
        ("c10d", (row,) * n, (row,) * n),
        ("_c10d_functional", *uneven),
        ("_c10d_functional", *uneven),
        ("c10d", tuple((j + 1) * row for j in range(n)), tuple((j + 1) * row for j in range(n))),
        ("_dtensor", (8 * 4,) * n, (8 * 4,) * n),
        ("c10d", None, None),
    ]
    comm.generate_json_dump(tmp_path / "dump.json")
    loaded = commdebug.load(tmp_path / "dump.json")
    assert [(e.send_splits, e.recv_splits) for e in loaded.events] == [g[1:] for g in got]


ROUTER = ROOT / "tutorials" / "programs" / "12_moe.py"


def _launch_router(out: Path, world: int, extra: list[str]) -> list[dict]:
    """Tutorial 12's MoE layer on `world` per-rank processes of the fake backend; each rank's
    ``routed`` line (the tokens its experts received per step, by the program's own count)."""
    procs = [subprocess.Popen([sys.executable, str(ROUTER), str(out), "--fake", str(r), str(world), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
             for r in range(world)]
    routed = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=DEADLINE_S)
            assert p.returncode == 0 and "moe done rank" in stdout, stdout + stderr[-3000:]
            routed.append(json.loads(next(ln for ln in stdout.splitlines() if ln.startswith("routed "))[len("routed "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return routed


def skewed_router(shared_run) -> tuple[Path, list[dict]]:
    """Tutorial 12's skewed router on 4 ranks, 3 steps: its folder (made once per run, read-only;
    the browser's traffic matrix reads it too) and each rank's ``routed`` line."""
    folder = shared_run.folder("moe4-skewed", lambda out: _launch_router(out, 4, ["--router", "skewed", "--steps", "3"]))
    return folder, shared_run.result("moe4-skewed")


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_skewed_routers_worst_step_and_rank_are_the_first_imbalance_row(shared_run):
    tmp_path, routed = skewed_router(shared_run)
    # the dispatch is each step's most uneven call: what each rank's experts received
    token_bytes = routed[0]["token_bytes"]
    got = {(step, r["rank"]): n * token_bytes for r in routed for step, n in enumerate(r["tokens_received"])}
    factors = {}
    for step in range(3):
        at = [got[(step, r)] for r in range(4)]
        factors[step] = (max(at) / (sum(at) / 4), at.index(max(at)), max(at))
    worst = max(factors, key=lambda s: factors[s][0])
    done = cli("report", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["all_to_all_imbalance"]
    assert len(rows) == 3 and [r["factor"] for r in rows] == sorted((r["factor"] for r in rows), reverse=True)
    first = rows[0]
    assert (first["step"], first["rank"], first["bytes"]) == (worst, factors[worst][1], factors[worst][2])
    assert first["factor"] == pytest.approx(factors[worst][0]) and first["factor"] > 1.2
    assert {r["step"]: round(r["factor"], 6) for r in rows} == {s: round(f[0], 6) for s, f in factors.items()}
    assert (first["group"], first["module"], first["ranks"], first["group_size"], first["calls"]) == ("default_pg[4]", "MoE", 4, 4, 5)
    text = cli("report", str(tmp_path)).stdout
    assert "all_to_all imbalance" in text
    section = text.split("all_to_all imbalance")[1].splitlines()
    line = next(ln for ln in section if ln.startswith(f"{worst}  "))
    assert line.split()[:4] == [str(worst), "default_pg[4]", f"{factors[worst][0]:.2f}", str(factors[worst][1])]
    # one rank's dump: its own largest receive per step (the dispatch, or the combine bringing
    # back what it sent), no factor, and the text says why
    one = cli("report", str(tmp_path / "rank2.json"), "--json")
    rows = json.loads(one.stdout)["all_to_all_imbalance"]
    assert {r["factor"] for r in rows} == {None} and {r["rank"] for r in rows} == {2}
    back = routed[2]["tokens_sent"] * token_bytes
    assert {r["step"]: r["bytes"] for r in rows} == {s: max(got[(s, 2)], back) for s in range(3)}
    assert "report the folder of all" in cli("report", str(tmp_path / "rank2.json")).stdout


def test_an_uneven_all_to_all_is_predicted_by_its_busiest_side(tmp_path):
    from commdebug.estimate import predict
    from commdebug.estimate.alpha_beta import effective_size
    from commdebug.estimate.timed import timed_calls
    from commdebug.model.rank_view import RankView

    g = GroupInfo("0", "default_pg", 4, (0, 1, 2, 3))
    kib = 1024
    # rank 0 sends 8 KiB in all but receives 24 KiB (its experts are popular)
    uneven = _event(0, g, (2 * kib,) * 4, (6 * kib,) * 4)
    even = {n: _event(0, g, (n // 4,) * 4, (n // 4,) * 4) for n in (8 * kib, 24 * kib)}
    assert uneven.size_bytes == 8 * kib and effective_size(uneven) == 24 * kib
    assert effective_size(even[8 * kib]) == 8 * kib
    at = {name: predict([e], "h100-ib400")[0] for name, e in (("uneven", uneven), ("small", even[8 * kib]), ("big", even[24 * kib]))}
    assert at["uneven"] == at["big"] > at["small"]
    # a folder: the call is charged its busiest member's bytes, whichever rank's event stands for it
    quiet = _event(0, g, (2 * kib,) * 4, (kib,) * 4)._replace(latency_s=1e-3)
    busy = _event(0, g, (2 * kib,) * 4, (10 * kib,) * 4)._replace(latency_s=2e-3)
    views = [RankView(r, tmp_path / f"rank{r}.json", {"rank": r}, {"0": g}, [e]) for r, e in ((0, quiet), (1, busy))]
    job = timed_calls(views)
    (call,) = job.calls
    assert (call.rank, call.seconds, call.ranks_timed) == (0, 1e-3, 2)
    assert effective_size(call.event) == 40 * kib and call.event.recv_splits == busy.recv_splits
