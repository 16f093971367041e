"""A small data-parallel training script: nothing in it knows about commdebug.

Launch:  torchrun --nproc-per-node 2 tutorials/programs/07_train.py --steps 3
"""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
for p in model.parameters():  # start every rank from rank 0's weights
    dist.broadcast(p.data, src=0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

torch.manual_seed(1 + rank)  # each rank its own shard of the data
for step in range(args.steps):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    for p in model.parameters():  # average the gradients across ranks
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    optimizer.zero_grad()
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    if rank == 0:
        print(f"step {step}: mean loss {torch.cat(losses).mean().item():.4f}")

dist.destroy_process_group()
