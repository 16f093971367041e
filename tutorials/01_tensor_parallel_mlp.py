"""Tutorial 1: a tensor-parallel MLP seen through CommDebugMode at noise levels 0-3.

Run it:  python tutorials/01_tensor_parallel_mlp.py
The page 01_tensor_parallel_mlp.md walks through this output.
"""

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from commdebug import CommDebugMode
from commdebug.demo import init_fake_world


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.act = nn.ReLU()
        self.down = nn.Linear(64, 16)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


# Four simulated ranks in this one process: counts and bytes are exact, no GPU needed.
init_fake_world(world_size=4)
mesh = init_device_mesh("cpu", (4,))
torch.manual_seed(0)
model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
x = torch.rand(8, 16, requires_grad=True)

comm = CommDebugMode()
with comm:
    model(x).sum().backward()

for level in range(4):
    print(f"===== noise_level={level} =====")
    print(comm.generate_comm_debug_tracing_table(noise_level=level, color=False), end="")

e = comm.trace.events[0]
print("===== first event =====")
print(f"{e.op} in {e.module} ({e.phase}): S={e.size_bytes} B on group {e.group_name} of {e.group_size}, busbw factor {e.busbw_factor}")
