"""An FSDP2 training job for real multi-process tests (torchrun, gloo, CPU): three blocks, each
its own FSDP unit, AdamW, a metric all_reduce inside a module every step.

Behaviour from the environment:
  FSDP_STEPS      training steps (default 12)
  FSDP_SKIP_STEP  at this step rank FSDP_SKIP_RANK (default 1) skips the metric's all_reduce:
                  the other rank waits in it until gloo's timeout (FSDP_PG_TIMEOUT s, default 10)
"""

import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("FSDP_PG_TIMEOUT", "10"))))
rank = dist.get_rank()
skip_step = int(os.environ.get("FSDP_SKIP_STEP", "-1"))
skip_rank = int(os.environ.get("FSDP_SKIP_RANK", "1"))
state = {"step": 0}


class Metric(torch.nn.Module):
    """Averages the batch mean over the ranks (for logging), as training code often does."""

    def forward(self, x):
        mean = x.detach().mean().reshape(1)
        if not (state["step"] == skip_step and rank == skip_rank):
            dist.all_reduce(mean)  # METRIC_ALL_REDUCE
        return x


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.metric = Metric()
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.metric(x))


torch.manual_seed(0)
model = Model()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(8, 32)
for step in range(int(os.environ.get("FSDP_STEPS", "12"))):
    state["step"] = step
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
