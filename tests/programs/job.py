"""A small training-like job for real multi-process tests, run under torchrun with gloo.

Behaviour from the environment, so one script covers every case:
  JOB_BAD       unset (consistent), skip (rank JOB_BAD_RANK skips the second step's all_reduce),
                size (that rank broadcasts a buffer twice as big: gloo accepts it silently),
                raise (that rank raises after step 1), sigterm (that rank gets SIGTERM after step 1)
  JOB_BAD_RANK  the odd rank (default 1)
  JOB_PG_TIMEOUT  seconds before gloo gives up on a stuck collective (default 30)
  JOB_FR_DIR    also write a Flight Recorder dump per rank there (needs TORCH_FR_BUFFER_SIZE)
"""

import datetime
import os
import signal

import torch
import torch.distributed as dist

bad = os.environ.get("JOB_BAD", "")
bad_rank = int(os.environ.get("JOB_BAD_RANK", "1"))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("JOB_PG_TIMEOUT", "30"))))
rank, world = dist.get_rank(), dist.get_world_size()
odd = rank == bad_rank
pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)]  # every rank creates every group
pair = pairs[rank // 2] if rank // 2 < len(pairs) else None

model = torch.nn.Linear(16, 16)
x = torch.randn(8, 16)
try:
    for step in range(2):
        model(x).sum().backward()
        grad = model.weight.grad
        if not (bad == "skip" and odd and step == 1):
            dist.all_reduce(grad)
        dist.broadcast(torch.ones(2048 if bad == "size" and odd and step == 1 else 1024), src=0)
        if pair is not None:
            dist.all_reduce(torch.ones(4), group=pair)
        if rank % 2 == 0 and rank + 1 < world:
            dist.send(torch.ones(4), rank + 1)
        elif rank % 2 == 1:
            dist.recv(torch.empty(4), rank - 1)
        model.weight.grad = None
        if step == 0 and odd and bad == "raise":
            raise RuntimeError(f"rank {rank} fails on purpose")
        if step == 0 and odd and bad == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
    dist.barrier()
finally:
    if os.environ.get("JOB_FR_DIR"):
        os.makedirs(os.environ["JOB_FR_DIR"], exist_ok=True)
        with open(os.path.join(os.environ["JOB_FR_DIR"], f"fr_trace_{rank}"), "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
if bad != "raise":
    dist.destroy_process_group()
