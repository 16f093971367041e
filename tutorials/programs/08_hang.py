"""A training loop with a bug: on rank 1 a rank-dependent branch skips the gradient all_reduce
of the second step, so the ranks disagree on what comes next and wait for each other until
gloo's timeout (8 s here; the default is 30 minutes).

Launch:  torchrun --nproc-per-node 2 tutorials/programs/08_hang.py
"""

from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=8))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(32, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(3):
    batch = torch.randn(16, 32) if rank == 0 else torch.empty(16, 32)
    dist.broadcast(batch, src=0)  # rank 0 loads the data and shares it
    model(batch).sum().backward()
    skip_sync = rank == 1 and step == 1  # the bug: say, "nothing to sync on this rank this step"
    if not skip_sync:
        for p in model.parameters():
            dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()

dist.destroy_process_group()
