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
