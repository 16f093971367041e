"""A two-stage GPipe schedule on gloo, with no commdebug in it: recorded by `commdebug run`,
which starts before this program imports torch.distributed.pipelining."""

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
stage_module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: ((out - target) ** 2).mean())
x, y = torch.randn(4, 8), torch.randn(4, 8)
if rank == 0:
    schedule.step(x)
else:
    schedule.step(target=y)
dist.barrier()
dist.destroy_process_group()
