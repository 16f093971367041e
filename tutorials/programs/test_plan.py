"""A parallel plan as a regression test: one training step of the tensor-parallel model, recorded
on the fake backend (4 simulated ranks, no GPU), must issue exactly the collectives of the
stored baseline. Regenerate the baseline on purpose with  UPDATE_BASELINE=1 pytest test_plan.py
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

import commdebug
from commdebug.analysis.diff import diff_traces
from commdebug.demo import init_fake_world
from commdebug.render.diff import render_diff

HERE = Path(__file__).parent
BASELINE = HERE / "plan_baseline.json"
THIS_RUN = HERE / "plan_this_run.json"  # written on a failure, for `commdebug diff` or the viewer


def load_plan():
    spec = importlib.util.spec_from_file_location("plan", HERE / "09_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PLAN


class Block(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def mesh():
    init_fake_world(world_size=4)
    return init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))


def record_one_step(mesh) -> commdebug.CommDebugMode:
    torch.manual_seed(0)
    model = parallelize_module(Model(), mesh, load_plan())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm = commdebug.CommDebugMode()
    with comm:
        model(torch.randn(8, 32)).sum().backward()
        optimizer.step()
    return comm


def test_plan_issues_the_baseline_collectives(mesh):
    comm = record_one_step(mesh)
    if os.environ.get("UPDATE_BASELINE") == "1":
        comm.generate_json_dump(str(BASELINE))
        pytest.skip(f"baseline written to {BASELINE.name}")
    assert BASELINE.exists(), f"no {BASELINE.name}: record it once with UPDATE_BASELINE=1"
    changes = diff_traces(commdebug.load(BASELINE), comm.trace)
    if changes:
        comm.generate_json_dump(str(THIS_RUN))
    assert not changes, render_diff(changes, BASELINE.name, THIS_RUN.name)
