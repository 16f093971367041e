"""A two-stage pipeline (GPipe schedule) on gloo: one stage per rank, recorded by commdebug.

Launch:  torchrun --nproc-per-node 2 tutorials/programs/05_pipeline.py OUT_DIR
Each rank writes OUT_DIR/rank<R>.json.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from commdebug import CommDebugMode

BATCH, MICROBATCHES, WIDTH = 8, 4, 32


class Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.relu(self.linear(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = Stage()
stage = PipelineStage(model, rank, world, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, y: ((out - y) ** 2).mean())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)

comm = CommDebugMode()
with comm:
    for step in range(2):
        if rank == 0:
            schedule.step(x)  # the first stage feeds the batch
        else:
            schedule.step(target=y)  # the last stage computes the loss
        optimizer.step()  # marks a step boundary
        optimizer.zero_grad()
comm.generate_json_dump(f"{sys.argv[1]}/rank{rank}.json")

dist.barrier()
dist.destroy_process_group()
