"""A model whose layers each reduce one activation across ranks, the all_reduce either blocking
(the rank waits for it before computing on) or issued asynchronously under an independent branch
of compute and waited for after it; or an FSDP2 model. Nothing in it knows about commdebug.

Launch:  torchrun --nproc-per-node 2 tutorials/programs/13_overlap.py --mode async --steps 4
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("blocking", "async", "fsdp2"), default="async")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--layers", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
WIDTH, BRANCH = 256, 384


class Layer(nn.Module):
    """Reduces its projection across ranks; an independent branch computes meanwhile."""

    def __init__(self, blocking: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.branch = nn.Sequential(nn.Linear(WIDTH, BRANCH), nn.GELU(), nn.Linear(BRANCH, WIDTH))
        self.blocking = blocking

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.proj(x).detach()
        if self.blocking:
            dist.all_reduce(shared)  # waits here: nothing computes meanwhile
            return torch.tanh(self.branch(x) + shared)
        work = dist.all_reduce(shared, async_op=True)  # runs while the branch computes
        out = self.branch(x)
        work.wait()
        return torch.tanh(out + shared)


if args.mode == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, BRANCH), nn.GELU(), nn.Linear(BRANCH, WIDTH)) for _ in range(args.layers)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
else:
    model = nn.Sequential(*(Layer(args.mode == "blocking") for _ in range(args.layers)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

torch.manual_seed(1 + rank)
for step in range(args.steps):
    x = torch.randn(512, WIDTH)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
if rank == 0:
    print(f"{args.mode}: {args.steps} steps done")
dist.destroy_process_group()
