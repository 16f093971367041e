"""Real multi-process runs: gloo on CPU, 2 and 4 spawned ranks, each dump checked: tensor
parallelism and eager collectives, a pipelining schedule, and a cross-check against
torch.profiler's own gloo events."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import torch.multiprocessing as mp

import commdebug

import gloo_worker
from ports import free_port

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

DEADLINE_S = 120


def spawn_ranks(worker, world_size: int, out_dir: str) -> None:
    """``worker(rank, world_size, port, out_dir)`` on `world_size` gloo ranks, each its own
    process, failing the test if they do not all finish within DEADLINE_S.

    The ranks are forked from a server that imported torch (and DTensor, and the workers) once
    for the whole session: a freshly spawned rank spends a second of CPU importing them again."""
    mp.set_forkserver_preload(["torch", "torch.distributed.tensor", "gloo_worker"])
    ctx = mp.start_processes(worker, args=(world_size, free_port(), out_dir), nprocs=world_size, join=False,
                             start_method="forkserver")
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            alive = [i for i, p in enumerate(ctx.processes) if p.exitcode is None]
            pytest.fail(f"ranks {alive} did not finish within {DEADLINE_S}s")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.timeout(DEADLINE_S + 30)
def test_gloo_ranks_record_counts_and_bytes(world_size, tmp_path):
    spawn_ranks(gloo_worker.run, world_size, str(tmp_path))
    for rank in range(world_size):
        trace = commdebug.load(tmp_path / f"rank{rank}.json")
        meta = trace.metadata
        assert (meta["rank"], meta["world_size"], meta["backend"]) == (rank, world_size, "gloo")
        ops = [(e.op, e.phase, e.step) for e in trace.events]
        # per step: the row-parallel forward all_reduce and the column-parallel backward one
        for step in (0, 1):
            assert ops.count(("all_reduce", "forward", step)) == 1
            assert ops.count(("all_reduce", "backward", step)) == 1
        tail = [e.op for e in trace.events if e.step == 2]
        assert tail == ["all_reduce", "broadcast", "send", "recv", "barrier"]
        by_key = {e.key: e for e in trace.events if e.step == 2}
        assert by_key["c10d.allreduce_"].size_bytes == 8 * 4
        assert by_key["c10d.allreduce_"].busbw_factor == pytest.approx(2 * (world_size - 1) / world_size)
        assert by_key["c10d.send"].size_bytes == by_key["c10d.recv_"].size_bytes == 8 * 4
        assert by_key["c10d.monitored_barrier_"].size_bytes == 0
        forward = [e for e in trace.events if e.op == "all_reduce" and e.phase == "forward"]
        assert forward[0].module == "Sequential.2"
        assert forward[0].size_bytes == 4 * 16 * 4  # the full (4, 16) float32 output
        assert all(e.group_size == world_size for e in trace.events)
        assert trace.collective_counts("Sequential", "forward") == {"c10d_functional.all_reduce": 2}


@pytest.mark.timeout(DEADLINE_S + 30)
def test_pipelining_sends_and_recvs_by_phase_peer_and_microbatch(tmp_path):
    spawn_ranks(gloo_worker.pipeline, 2, str(tmp_path))
    first, last = (commdebug.load(tmp_path / f"rank{r}.json") for r in (0, 1))
    mb_bytes = gloo_worker.BATCH // gloo_worker.MICROBATCHES * gloo_worker.WIDTH * 4
    scheduled = {r: [e for e in t.events if e.microbatch is not None] for r, t in ((0, first), (1, last))}
    for rank, trace in ((0, first), (1, last)):
        peer = 1 - rank
        # activations go forward from stage 0 to 1, gradients come back
        fwd_op, bwd_op = ("send", "recv") if rank == 0 else ("recv", "send")
        for step in (0, 1):
            events = [e for e in scheduled[rank] if e.step == step]
            assert [(e.phase, e.op, e.microbatch) for e in events] == [
                ("forward", fwd_op, mb) for mb in range(gloo_worker.MICROBATCHES)
            ] + [("backward", bwd_op, mb) for mb in range(gloo_worker.MICROBATCHES)], rank
            assert {e.peer for e in events} == {peer}
            assert {e.size_bytes for e in events} == {mb_bytes}
            assert {e.module for e in events} == {"Sequential"}  # the stage's module
            assert all(e.seq is None and e.p2p_seq is not None for e in events)
        # no scheduled send/recv is left at Global or labelled by where it ran
        assert trace.collective_counts("Sequential", "backward") == {("c10d.recv_" if rank == 0 else "c10d.send"): 8}
    # the two sides pair up by (peer, p2p sequence): same microbatch, same bytes
    sends = {(e.p2p_seq, e.microbatch, e.size_bytes, e.phase) for e in scheduled[0] if e.op == "send"}
    recvs = {(e.p2p_seq, e.microbatch, e.size_bytes, e.phase) for e in scheduled[1] if e.op == "recv"}
    assert sends == recvs and len(sends) == 8


# gloo runs reduce_scatter_tensor as an all_reduce, and its profiler event is named for that
_GLOO_NAME = {"reduce_scatter": "gloo:all_reduce"}


@pytest.mark.timeout(DEADLINE_S + 30)
def test_counts_per_op_equal_torch_profiler_gloo_events(tmp_path):
    spawn_ranks(gloo_worker.profiled, 2, str(tmp_path))
    for rank in range(2):
        trace = commdebug.load(tmp_path / f"rank{rank}.json")
        profiler = Counter(json.loads((tmp_path / f"profiler{rank}.json").read_text()))
        ours = Counter(_GLOO_NAME.get(e.op, f"gloo:{e.op}") for e in trace.events)
        assert ours == profiler, rank
        assert ours["gloo:all_gather"] >= 5 and sum(ours.values()) == trace.totals()["collectives"]
