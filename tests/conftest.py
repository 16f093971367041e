"""Shared fixtures: one simulated 8-rank world (torch's fake backend) per test process."""

from __future__ import annotations

import pytest
import torch

WORLD = 8


@pytest.fixture(scope="session")
def world() -> int:
    from commdebug.demo import init_fake_world

    init_fake_world(WORLD)
    return WORLD


@pytest.fixture(scope="session")
def mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


@pytest.fixture
def tp_transformer(world):
    """A fresh 2-layer tensor-parallel transformer and its input tokens."""
    from commdebug.demo import ModelConfig, tensor_parallel_transformer

    def make(**cfg):
        model = tensor_parallel_transformer(ModelConfig(**{"n_layers": 2, **cfg}), world)
        tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
        return model, tokens

    return make


def plain_counts(module_counts) -> dict:
    """comm_module_counts with op keys as text and zero entries dropped, for comparisons."""
    return {
        fqn: {phase: {str(k): v for k, v in ops.items() if v} for phase, ops in phases.items()}
        for fqn, phases in module_counts.items()
    }
