"""What the reference gets wrong: many steps in one context, modules called several times,
shared modules, nested contexts, exceptions, steps, hook cleanup."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor.debug import CommDebugMode as ReferenceMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.modules import module as nn_module

from commdebug import CommDebugMode

from conftest import plain_counts


def _scaled(counts: dict, k: int) -> dict:
    return {f: {p: {op: n * k for op, n in ops.items()} for p, ops in ph.items()} for f, ph in counts.items()}


def test_reference_breaks_on_second_step(tp_transformer):
    model, tokens = tp_transformer()
    with pytest.raises(IndexError):
        with ReferenceMode():
            for _ in range(2):
                model(tokens).sum().backward()


@pytest.mark.parametrize("checkpoint_layers", [False, True])
def test_three_steps_count_three_times_one_step(tp_transformer, checkpoint_layers):
    model, tokens = tp_transformer(checkpoint_layers=checkpoint_layers)

    def step():
        model(tokens).sum().backward()
        model.zero_grad(set_to_none=True)  # so every step runs the same ops

    step()  # the first step also warms DTensor's caches, with ops of its own
    one = CommDebugMode()
    with one:
        step()
    three = CommDebugMode()
    with three:
        for _ in range(3):
            step()
    assert plain_counts(three.comm_module_counts) == _scaled(plain_counts(one.comm_module_counts), 3)
    # ops are aggregated: three steps take no more rows than one
    assert sum(map(len, three.trace.op_counts.values())) == sum(map(len, one.trace.op_counts.values()))
    for fqn, _ in one.trace.walk():
        for phase in ("forward", "backward", "checkpoint"):
            assert [r.count * 3 for r in one.trace.operations(fqn, phase)] == [r.count for r in three.trace.operations(fqn, phase)]


def test_checkpoint_recompute_is_its_own_phase(tp_transformer):
    model, tokens = tp_transformer(checkpoint_layers=True)
    comm = CommDebugMode()
    with comm:
        model(tokens).sum().backward()
    recompute = {e.module for e in comm.trace.events if e.phase == "checkpoint"}
    # the attention output projection re-issues its all_reduce during recompute; the feed-forward
    # one does not, as non-reentrant checkpointing stops once backward has what it needs
    assert recompute == {f"Transformer.layers.{i}.attention.wo" for i in range(2)}
    assert comm.trace.phase_totals("Transformer.layers.0", "checkpoint")[0] == 1
    assert comm.trace.phase_totals("Transformer.layers.0.attention", "checkpoint")[0] == 1
    assert comm.trace.phase_totals("Global", "checkpoint")[0] == 2
    # the compatible view folds recompute into backward, as the reference does
    wo = "Transformer.layers.0.attention.wo"
    assert comm.comm_module_counts[wo]["backward"][torch.ops.c10d_functional.all_reduce] == 1


class _Twice(nn.Module):
    """Calls one tensor-parallel MLP twice per forward, and a shared one from two parents."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.shared = nn.Linear(16, 16)
        self.a = nn.Sequential(self.shared)
        self.b = nn.Sequential(self.shared)

    def forward(self, x):
        return self.b(self.a(self.mlp(self.mlp(x))))


def test_module_called_twice_and_shared_module(mesh):
    model = _Twice()
    plan = {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel(), "shared": ColwiseParallel(use_local_output=False)}
    model = parallelize_module(model, mesh, plan)
    comm = CommDebugMode()
    with comm:
        model(torch.rand(4, 16, requires_grad=True)).sum().backward()
    fwd = comm.trace.collective_counts
    assert fwd("_Twice.mlp", "forward") == {"c10d_functional.all_reduce": 2}
    assert fwd("_Twice.mlp.2", "forward") == {"c10d_functional.all_reduce": 2}
    # the mlp tree appears once, not once per call
    assert comm.trace.modules["_Twice"].children.count("_Twice.mlp") == 1
    # the shared module is named once and counted from both call sites
    assert "_Twice.shared" in comm.trace.modules
    assert comm.trace.phase_totals("_Twice.mlp.0", "backward")[0] == 2


def test_nested_contexts_both_record(tp_transformer):
    model, tokens = tp_transformer()
    outer, inner = CommDebugMode(), CommDebugMode()
    with outer:
        model(tokens).sum().backward()
        with inner:
            model(tokens).sum().backward()
    assert inner.get_total_counts() > 0
    assert outer.get_total_counts() == 2 * inner.get_total_counts()
    assert plain_counts(outer.comm_module_counts) == _scaled(plain_counts(inner.comm_module_counts), 2)


def _our_hooks_left() -> int:
    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks) + len(nn_module._global_backward_pre_hooks)


def test_exception_inside_context_cleans_up_and_keeps_data(tp_transformer, tmp_path):
    model, tokens = tp_transformer()
    hooks_before = {name: len(m._forward_hooks) for name, m in model.named_modules()}
    comm = CommDebugMode()
    with pytest.raises(RuntimeError, match="boom"):
        with comm:
            model(tokens).sum().backward()
            model.layers[1].register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
            model(tokens)
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None
    assert _our_hooks_left() == 0
    assert {name: len(m._forward_hooks) for name, m in model.named_modules()} == hooks_before
    # what was recorded before the error is still there and renders
    assert comm.get_total_counts() > 0
    comm.generate_json_dump(tmp_path / "after_error.json")
    assert "Transformer.layers.0" in comm.generate_comm_debug_tracing_table(0)
    # and the model runs normally afterwards, without our tracking
    model.layers[1]._forward_pre_hooks.clear()
    model(tokens).sum().backward()
    assert comm.trace.modules.keys() >= {"Transformer.layers.1"}


def test_no_hooks_left_after_normal_exit(tp_transformer):
    model, tokens = tp_transformer()
    before = _our_hooks_left()
    per_module = {name: len(m._forward_hooks) for name, m in model.named_modules()}
    with CommDebugMode():
        for _ in range(2):
            model(tokens).sum().backward()
    assert _our_hooks_left() == before
    assert {name: len(m._forward_hooks) for name, m in model.named_modules()} == per_module
    from torch.optim.optimizer import _global_optimizer_post_hooks

    assert len(_global_optimizer_post_hooks) == 0


def test_optimizer_step_marks_steps(tp_transformer):
    model, tokens = tp_transformer()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    comm = CommDebugMode()
    with comm:
        for _ in range(3):
            model(tokens).sum().backward()
            opt.step()
            opt.zero_grad()
    steps = [e.step for e in comm.trace.events]
    assert sorted(set(steps)) == [0, 1, 2]
    assert steps.count(0) == steps.count(1) == steps.count(2)
    assert comm.trace.steps == 3


def test_manual_and_optimizer_steps_count_once(tp_transformer):
    model, tokens = tp_transformer()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    comm = CommDebugMode()
    with comm:
        for _ in range(2):
            for _ in range(2):  # gradient accumulation: two micro-batches per step
                model(tokens).sum().backward()
            opt.step()
            comm.step()
    assert sorted({e.step for e in comm.trace.events}) == [0, 1]
