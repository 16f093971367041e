"""One rank of a real multi-process gloo job (spawned by test_multiprocess.py)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from commdebug import CommDebugMode


def run(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (world_size,))
        mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        mlp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
        comm = CommDebugMode()
        with comm:
            for _ in range(2):
                mlp(torch.ones(4, 16, requires_grad=True)).sum().backward()
                opt.step()
                opt.zero_grad()
            # eager collectives and a point-to-point ring, as pipeline parallelism uses
            t = torch.full((8,), float(rank))
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
            recv = torch.empty(8)
            ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, recv, prv)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            dist.monitored_barrier()
        assert torch.equal(t, torch.full((8,), float(sum(range(world_size)))))
        comm.generate_json_dump(os.path.join(out_dir, f"rank{rank}.json"))
    finally:
        dist.destroy_process_group()


def _init(rank: int, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


MICROBATCHES, BATCH, WIDTH = 4, 8, 16


def pipeline(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One stage per rank of a pipelining schedule (GPipe), two training steps."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    _init(rank, world_size, port)
    try:
        torch.manual_seed(rank)
        stage_module = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
        stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, target: ((out - target) ** 2).mean())
        opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
        x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
        comm = CommDebugMode()
        with comm:
            for _ in range(2):
                if rank == 0:
                    schedule.step(x)
                elif rank == world_size - 1:
                    schedule.step(target=y)
                else:
                    schedule.step()
                opt.step()
                opt.zero_grad()
        comm.generate_json_dump(os.path.join(out_dir, f"rank{rank}.json"))
    finally:
        dist.destroy_process_group()


def profiled(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Tensor parallelism, FSDP2 and eager collectives under torch.profiler and CommDebugMode
    at once; writes our dump and the profiler's gloo:* event counts."""
    import json
    from collections import Counter

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.profiler import ProfilerActivity, profile

    _init(rank, world_size, port)
    try:
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (world_size,))
        mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        mlp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        sharded = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
        for layer in sharded:
            fully_shard(layer)
        fully_shard(sharded)
        comm = CommDebugMode()
        with profile(activities=[ProfilerActivity.CPU]) as prof, comm:
            for _ in range(2):
                mlp(torch.ones(4, 16)).sum().backward()
                sharded(torch.ones(4, 16)).sum().backward()
            t = torch.ones(8)
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            dist.all_gather_into_tensor(torch.empty(8 * world_size), t)
            dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world_size))
            dist.all_to_all_single(torch.empty(8 * world_size), torch.ones(8 * world_size))
            dist.barrier()
            if rank == 0:
                dist.send(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
        comm.generate_json_dump(os.path.join(out_dir, f"rank{rank}.json"))
        gloo = Counter(e.name for e in prof.events() if e.name.startswith("gloo:"))
        with open(os.path.join(out_dir, f"profiler{rank}.json"), "w") as f:
            json.dump(gloo, f)
    finally:
        dist.destroy_process_group()
