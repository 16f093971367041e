"""A small training job for `commdebug run --light` (torchrun, gloo, CPU), with no commdebug in
it: every step a metric all_reduce issued from inside a module's forward, then one all_reduce per
gradient (DDP-style, by hand), then an SGD step. The test counts these from its constants.

Environment: LIGHT_STEPS training steps (default 3)."""

import os

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("LIGHT_STEPS", "3"))
PARAMS = 4  # two Linear layers: weight and bias each, one all_reduce per gradient


class Metric(torch.nn.Module):
    """Averages the batch mean over the ranks, as training code does for logging."""

    def forward(self, x):
        mean = x.detach().mean().reshape(1)
        dist.all_reduce(mean)  # the metric's all_reduce, one per step
        return x


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        self.metric = Metric()

    def forward(self, x):
        return self.fc2(self.metric(torch.relu(self.fc1(x))))


dist.init_process_group("gloo")
torch.manual_seed(0)
model = Model()
assert len(list(model.parameters())) == PARAMS
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)
for _ in range(STEPS):
    model(x).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # one per gradient
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()
dist.destroy_process_group()
