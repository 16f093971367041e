"""A gloo job that profiles itself with plain torch.profiler (no commdebug): per step, 2 parameter
all_reduces, an async all_reduce under compute, an all_gather, an all_to_all, a broadcast on a
subgroup, a send/recv and a barrier: 9 calls per rank per step. Writes OUT/rank<R>.pt.trace.json.

    RANK=.. WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python profiled_job.py OUT [--gz]
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

out = Path(sys.argv[1])
suffix = ".pt.trace.json.gz" if "--gz" in sys.argv else ".pt.trace.json"
dist.init_process_group("gloo")
rank = dist.get_rank()
sub = dist.new_group([0, 1])
model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
x = torch.randn(64, 128)


def step() -> None:
    model(x).sum().backward()
    for p in list(model.parameters())[:2]:
        dist.all_reduce(p.grad)
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    model(x).sum()
    work.wait()
    dist.all_gather_into_tensor(torch.empty(2 * 100), torch.ones(100))
    dist.all_to_all_single(torch.empty(4), torch.arange(4.0))
    dist.broadcast(torch.ones(10), 0, group=sub)
    if rank == 0:
        dist.send(torch.ones(5), 1)
    else:
        dist.recv(torch.empty(5), 0)
    dist.barrier()


def ready(prof: profile) -> None:
    prof.export_chrome_trace(str(out / f"rank{rank}{suffix}"))


with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=3),
             on_trace_ready=ready) as prof:
    for _ in range(4):
        step()
        prof.step()
print(f"profiled job done rank {rank}", flush=True)
dist.destroy_process_group()
