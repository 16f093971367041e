"""A job whose ranks issue the same all_reduce from different lines, for `commdebug check`'s
`diverged` finding (torchrun, gloo, CPU). Each step: a forward through two blocks, each averaging
a statistic of its output over the ranks (the same all_reduce, same size, from two lines), then a
backward and ``optimizer.step()``, which marks the step.

    torchrun --nproc-per-node N -m commdebug run --out traces -- parted_job.py CASE [RANK]

CASE:
  skip    rank RANK (default 1) skips, in step SKIP_STEP, the attention's all_reduce; its next
          all_reduce (the MLP's: same op, size and dtype) pairs with the others' skipped one,
          every later one pairs one call off, and an extra all_reduce after the loop evens the
          count, so gloo runs it all through while reducing the wrong tensors
  branch  odd ranks average a loss from another line than even ranks, every step: healthy
"""

import sys

import torch
import torch.distributed as dist

SKIP_STEP = 3
STEPS = 5

case = sys.argv[1]
skipper = int(sys.argv[2]) if len(sys.argv) > 2 else 1
dist.init_process_group("gloo")
rank = dist.get_rank()
state = {"step": 0}


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wo = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.wo(x)
        if not (case == "skip" and rank == skipper and state["step"] == SKIP_STEP):
            dist.all_reduce(y.detach().mean(0))  # SKIPPED_ALL_REDUCE
        return y


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.w2(torch.relu(x))
        dist.all_reduce(y.detach().mean(0))  # NEXT_ALL_REDUCE
        return y


model = torch.nn.Sequential(Attention(), MLP())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 16)
for step in range(STEPS):
    state["step"] = step
    loss = model(x).sum()
    if case == "branch" and rank % 2:
        dist.all_reduce(loss.detach().reshape(1).clone())  # ODD_RANKS_LINE
    elif case == "branch":
        dist.all_reduce(loss.detach().reshape(1).clone())  # EVEN_RANKS_LINE
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if case == "skip" and rank == skipper:
    dist.all_reduce(torch.zeros(16))  # EVENS_THE_COUNT
dist.destroy_process_group()
