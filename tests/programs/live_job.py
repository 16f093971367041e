"""A training loop for the streaming tests, run under torchrun with gloo and `commdebug run`.

Each step: a forward and backward, one all_reduce per gradient, ``optimizer.step()`` (which
marks the step). Behaviour from the environment:
  LIVE_STEPS      steps (default 6)
  LIVE_BAD        unset (healthy), kill (rank 1 SIGKILLs itself as step LIVE_AT starts),
                  abort (rank 1 calls os.abort() as step LIVE_AT starts: SIGABRT, as a native crash),
                  sleep (rank 1 sleeps LIVE_SLEEP seconds as step LIVE_AT starts; the others wait),
                  apart (at step LIVE_AT rank 1 all_reduces on a side group rank 0 never calls:
                  both wait in a collective for good),
                  spin (at step LIVE_AT every rank writes ready<rank> in its folder and loops in
                  Python: a signal then arrives while Python code runs)
  LIVE_AT         the step (default 3)
  LIVE_SLEEP      seconds (default 600)
  LIVE_PG_TIMEOUT seconds before gloo gives up on a stuck collective (default 60)
"""

import datetime
import os
import signal
import time

import torch
import torch.distributed as dist

bad = os.environ.get("LIVE_BAD", "")
at = int(os.environ.get("LIVE_AT", "3"))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("LIVE_PG_TIMEOUT", "60"))))
rank = dist.get_rank()
side = dist.new_group(list(range(dist.get_world_size()))) if bad == "apart" else None
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(os.environ.get("LIVE_STEPS", "6"))):
    if rank == 1 and step == at and bad == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1 and step == at and bad == "abort":
        os.abort()  # ABORT_LINE
    if rank == 1 and step == at and bad == "sleep":
        time.sleep(float(os.environ.get("LIVE_SLEEP", "600")))
    if rank == 1 and step == at and bad == "apart":
        dist.all_reduce(torch.ones(2), group=side)  # SIDE_ALL_REDUCE
    if step == at and bad == "spin":
        open(f"ready{rank}", "w").close()
        while True:
            pass
    model(torch.randn(4, 8)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # GRAD_ALL_REDUCE
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
