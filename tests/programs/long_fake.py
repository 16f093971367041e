"""A long fake-process-group loop for the keep-steps test, run under `commdebug run`:
STEPS steps (argv[1], default 3000) of 10 all_reduces each, optimizer.step() marking each
step. Every 100 steps it notes the size of its own stream (argv[2], the file commdebug streams
to) and prints the largest seen, so the test knows the file stayed bounded while it ran."""

import os
import sys

import torch
import torch.distributed as dist

from commdebug.demo import init_fake_world

init_fake_world(8)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
stream = sys.argv[2] if len(sys.argv) > 2 else None
param = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([param], lr=0.1)
largest = 0
for step in range(steps):
    for _ in range(10):
        dist.all_reduce(torch.ones(256))
    param.grad = torch.zeros(4)
    opt.step()
    if stream and step % 100 == 99 and os.path.exists(stream):
        largest = max(largest, os.path.getsize(stream))
print(f"largest stream: {largest}")
