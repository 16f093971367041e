"""Real multi-process runs: gloo on CPU, 2 and 4 spawned ranks, each dump checked."""

from __future__ import annotations

import socket
import time

import pytest
import torch.multiprocessing as mp

import commdebug
import gloo_worker

DEADLINE_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world_size: int, out_dir: str) -> None:
    ctx = mp.start_processes(gloo_worker.run, args=(world_size, _free_port(), out_dir), nprocs=world_size, join=False, start_method="spawn")
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
    _spawn(world_size, str(tmp_path))
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
