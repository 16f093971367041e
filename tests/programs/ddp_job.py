"""A DDP training loop on gloo, small enough for tests that start real jobs: a Linear model,
STEPS steps, and one late rank: rank LATE_RANK's data loader stalls LATE_S seconds before step
LATE_STEP's forward, so the others wait for it in DDP's gradient all_reduce. Run under torchrun
(one node or several) and `commdebug run`.

  STEPS      steps (default 6)
  LATE_RANK  the late rank (default 3; -1: none)
  LATE_STEP  the step it is late at (default 3)
  LATE_S     how late, in seconds (default 0.5)
  STEP_S     seconds of other work per step, so that a job runs long enough to be watched (default 0)
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

steps = int(os.environ.get("STEPS", "6"))
late_rank = int(os.environ.get("LATE_RANK", "3"))
late_step = int(os.environ.get("LATE_STEP", "3"))
late_s = float(os.environ.get("LATE_S", "0.5"))
step_s = float(os.environ.get("STEP_S", "0"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 64)
for step in range(steps):
    time.sleep(step_s)  # the rest of the step's work
    if rank == late_rank and step == late_step:
        time.sleep(late_s)  # its data loader stalls
    loss = model(x).sum()
    loss.backward()  # DDP all_reduces the gradients here: the others wait for the late rank
    optimizer.step()  # the step boundary
    optimizer.zero_grad()
dist.destroy_process_group()
