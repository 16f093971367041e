"""Drop-in compatibility: the same workloads under torch's CommDebugMode and ours give the same
counts per module and phase, the same keys, and the same query API."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode as ReferenceMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from commdebug import CommDebugMode

from conftest import plain_counts

c10d_functional = torch.ops.c10d_functional


def _mlp(mesh):
    from torch.testing._internal.distributed._tensor.common_dtensor import MLPModule

    torch.manual_seed(0)
    model = parallelize_module(MLPModule("cpu"), mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
    return model, torch.rand(8, 10)


def _mlp_stacked(mesh):
    from torch.testing._internal.distributed._tensor.common_dtensor import MLPStacked

    torch.manual_seed(0)
    plan = {}
    for i in range(2):
        plan[f"layers.{i}.net1"] = ColwiseParallel()
        plan[f"layers.{i}.net2"] = RowwiseParallel()
    return parallelize_module(MLPStacked("cpu"), mesh, plan), torch.rand(8, 10)


def _run_both(make, step):
    modes = []
    for cls in (ReferenceMode, CommDebugMode):
        model, inp = make()
        mode = cls()
        with mode:
            step(model, inp)
        modes.append(mode)
    return modes


def _fwd_bwd(model, inp):
    model(inp).sum().backward()


@pytest.mark.proc
@pytest.mark.parametrize("workload", ["mlp", "mlp_stacked", "transformer", "transformer_checkpointed"])
def test_counts_equal_reference_per_module_and_phase(workload, mesh, tp_transformer):
    make = {
        "mlp": lambda: _mlp(mesh),
        "mlp_stacked": lambda: _mlp_stacked(mesh),
        "transformer": lambda: tp_transformer(),
        "transformer_checkpointed": lambda: tp_transformer(checkpoint_layers=True),
    }[workload]
    ref, ours = _run_both(make, _fwd_bwd)
    assert plain_counts(ours.comm_module_counts) == plain_counts(ref.comm_module_counts)
    assert {str(k): v for k, v in ours.get_comm_counts().items()} == {str(k): v for k, v in ref.get_comm_counts().items() if v}
    assert ours.get_total_counts() == ref.get_total_counts() > 0


def test_reference_style_assertions_work_unchanged(mesh):
    # the assertions of PyTorch's own test_MLP_module_tracing, verbatim in spirit
    model, inp = _mlp(mesh)
    comm_mode = CommDebugMode()
    with comm_mode:
        assert len(comm_mode.advanced_module_tracker.module_helper_dict) == 1
        assert comm_mode.comm_module_counts == {"Global": {"forward": {}, "backward": {}}}
        model(inp).sum().backward()
    assert len(comm_mode.advanced_module_tracker.module_helper_dict) == 5
    assert comm_mode.comm_module_counts["Global"]["forward"][c10d_functional.all_reduce] == 1
    assert comm_mode.comm_module_counts["MLPModule"]["forward"][c10d_functional.all_reduce] == 1
    assert comm_mode.comm_module_counts["MLPModule.net2"]["forward"][c10d_functional.all_reduce] == 1
    assert comm_mode.get_comm_counts()[c10d_functional.all_reduce] == 1
    assert comm_mode.get_comm_counts()[c10d_functional.all_gather_into_tensor] == 0
    assert repr(comm_mode) == "CommDebugMode(get_total_counts()=1)"


def test_parameter_and_sharding_info_match_reference(mesh):
    ref, ours = _run_both(lambda: _mlp_stacked(mesh), _fwd_bwd)
    assert ours.get_parameter_info().keys() == ref.get_parameter_info().keys()
    for fqn, params in ref.get_parameter_info().items():
        assert ours.get_parameter_info()[fqn].keys() == params.keys()
    assert ours.get_sharding_info() == ref.get_sharding_info()
    assert len(ours.get_sharding_info()) == 8


def test_reentering_resets_like_the_reference(mesh):
    model, inp = _mlp(mesh)
    comm = CommDebugMode()
    with comm:
        _fwd_bwd(model, inp)
    with comm:
        assert comm.get_parameter_info() == {}
        assert comm.get_sharding_info() == {}
        assert comm.get_total_counts() == 0


def test_defaults_match_reference_signatures():
    import inspect

    for name in ("generate_comm_debug_tracing_table", "log_comm_debug_tracing_table_to_file", "generate_json_dump"):
        ref = inspect.signature(getattr(ReferenceMode, name)).parameters
        ours = inspect.signature(getattr(CommDebugMode, name)).parameters
        for param, spec in ref.items():
            assert ours[param].default == spec.default, (name, param)
    CommDebugMode()  # no required arguments
