"""Four gloo ranks, one of them late: rank LATE_RANK is busy LATE_S seconds longer than the
others before its all_reduce in step LATE_STEP (its data loader stalls), so the others wait for
it inside that all_reduce. Run under `torchrun --nproc-per-node 4 -m commdebug run --timing`.

  LATE_RANK  the late rank (default 3)
  LATE_STEP  the step it is late at (default 2)
  LATE_S     how late, in seconds (default 0.8; 0: a balanced job)
  LATE_HOW   sleep (default: its loader waits) or compute (it multiplies matrices that long)
"""

import os
import time

import torch
import torch.distributed as dist

late_rank = int(os.environ.get("LATE_RANK", "3"))
late_step = int(os.environ.get("LATE_STEP", "2"))
late_s = float(os.environ.get("LATE_S", "0.8"))
late_how = os.environ.get("LATE_HOW", "sleep")

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 64)
for step in range(4):
    model(x).sum().backward()
    dist.barrier()  # the ranks start the step together
    if rank == late_rank and step == late_step:
        if late_how == "compute":  # extra work on this rank: what a profile shows in its gap
            a, until = torch.randn(256, 256), time.monotonic() + late_s  # a profile holds hundreds
            while time.monotonic() < until:
                torch.mm(a, a)
        else:
            time.sleep(late_s)  # this rank's data loader stalls
    dist.all_reduce(model.weight.grad)  # the others wait for it here
    optimizer.step()  # the step boundary
    optimizer.zero_grad()
dist.destroy_process_group()
