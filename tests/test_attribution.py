"""Where each collective lands, on the parallelism styles people run: FSDP2, sequence parallel,
2-D (FSDP + TP), optimizers that communicate, DDP-style hooks, modules that pass their input
through. Each workload is compared per module and phase with torch's CommDebugMode where it can
run (one step), and checked over many steps, where it cannot."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.graph import register_multi_grad_hook
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode as ReferenceMode

from commdebug import CommDebugMode
from commdebug.demo import ModelConfig, fsdp_tp_transformer, fsdp_transformer, tensor_parallel_transformer

from conftest import plain_counts

RS, AG, AR = "c10d._reduce_scatter_base_", "c10d._allgather_base_", "c10d_functional.all_reduce"
FUNC_RS, FUNC_AG = "c10d_functional.reduce_scatter_tensor", "c10d_functional.all_gather_into_tensor"


def _tokens():
    return torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))


def _one_step(mode_cls, make):
    model = make()
    mode = mode_cls()
    with mode:
        model(_tokens()).sum().backward()
    return plain_counts(mode.comm_module_counts), mode


def _moved_up(counts: dict, fqn: str, phase: str, key: str, n: int) -> dict:
    """torch's counts with ``n`` calls of ``key`` taken off ``fqn``: torch puts collectives issued
    when a module's backward finishes on the child whose backward ran last; we put them on the
    module itself (its parent here), which already counts them (counts include descendants)."""
    side = counts[fqn][phase]
    side[key] -= n
    if not side[key]:
        del side[key]
    return counts


def _assert_same(ours: dict, expected: dict) -> None:
    fqns = sorted(set(ours) | set(expected))
    diff = {f: (expected.get(f), ours.get(f)) for f in fqns if _nonzero(expected.get(f)) != _nonzero(ours.get(f))}
    assert not diff, f"per-module counts differ (expected, ours): {diff}"


def _nonzero(phases):
    return {p: ops for p, ops in (phases or {}).items() if ops}


# ---- FSDP2 ------------------------------------------------------------------------------------


def _padded_bytes(params, world: int) -> int:
    """FSDP2 pads dim 0 of each parameter to a multiple of the world size; S of the block's
    all_gather / reduce_scatter is the padded flat buffer, float32."""
    return sum(math.ceil(p.shape[0] / world) * world * math.prod(p.shape[1:]) for p in params) * 4


def test_fsdp2_matches_reference_except_post_backward_reduce_scatter(world):
    make = lambda: fsdp_transformer(ModelConfig(n_layers=2))  # noqa: E731
    ref, _ = _one_step(ReferenceMode, make)
    ours, comm = _one_step(CommDebugMode, make)
    root = "FSDPTransformer"
    expected = ref
    # torch: each block's reduce_scatter on its first submodule, the root's on the embedding
    for i in range(2):
        _moved_up(expected, f"{root}.layers.{i}.attention_norm", "backward", RS, 1)
    _moved_up(expected, f"{root}.tok_embeddings", "backward", RS, 1)
    _assert_same(ours, expected)
    for i in range(2):
        block = f"{root}.layers.{i}"
        # forward gather, and the block's post-backward reduce-scatter on the block itself
        assert comm.trace.collective_counts(block, "forward") == {AG: 1}
        assert comm.trace.collective_counts(block, "backward")[RS] == 1


def test_fsdp2_bytes_per_layer_follow_parameter_sizes(world):
    model = fsdp_transformer(ModelConfig(n_layers=2))
    comm = CommDebugMode()
    with comm:
        model(_tokens()).sum().backward()
    block = _padded_bytes(model.layers[0].parameters(), world)
    root = _padded_bytes([p for n, p in model.named_parameters() if not n.startswith("layers.")], world)
    by = {(e.phase, e.op, e.module): e.size_bytes for e in comm.trace.events}
    assert by[("forward", "all_gather", "FSDPTransformer")] == root
    for i in range(2):
        assert by[("forward", "all_gather", f"FSDPTransformer.layers.{i}")] == block
        assert by[("backward", "reduce_scatter", f"FSDPTransformer.layers.{i}")] == block
    assert by[("backward", "reduce_scatter", "FSDPTransformer")] == root
    # backward re-gathers: each block's pre-backward prefetches the block before it, so every
    # block is gathered again exactly once, by the module whose backward was starting
    regathers = [e for e in comm.trace.events if e.phase == "backward" and e.op == "all_gather"]
    assert [e.module for e in regathers] == ["FSDPTransformer", "FSDPTransformer.layers.1"]
    assert all(e.size_bytes == block for e in regathers)


class _Blocks(nn.Module):
    """FSDP2 blocks fed a plain input that needs no gradient (an image, features): the first
    block's post-backward hook never runs, FSDP2's final callback reduce-scatters it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_fsdp2_final_callback_reduce_scatter_belongs_to_its_block(world):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    original = FSDPParamGroup.post_backward
    model = _Blocks()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    x = torch.rand(4, 16)  # requires no grad
    ref = ReferenceMode()
    with ref:
        model(x).sum().backward()
    comm = CommDebugMode()
    with comm:
        model(x).sum().backward()
    assert FSDPParamGroup.post_backward is original  # unwrapped on exit
    for i in range(3):
        assert comm.trace.collective_counts(f"FSDP_Blocks.layers.{i}", "backward")[RS] == 1
    # the root has no parameters of its own: it reduce-scatters nothing
    assert comm.trace.collective_counts("FSDP_Blocks", "backward")[RS] == 3
    # as torch, but for its usual exception: each reduce-scatter on the block's first submodule
    expected = plain_counts(ref.comm_module_counts)
    for i in range(3):
        _moved_up(expected, f"FSDP_Blocks.layers.{i}.0", "backward", RS, 1)
    _assert_same(plain_counts(comm.comm_module_counts), expected)


@pytest.mark.parametrize("checkpoint_layers", [False, True])
def test_fsdp2_many_steps_with_optimizer(world, checkpoint_layers):
    model = fsdp_transformer(ModelConfig(n_layers=3, checkpoint_layers=checkpoint_layers))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        model(_tokens()).sum().backward()
        opt.step()
        opt.zero_grad()

    step()  # lazy init
    one = CommDebugMode()
    with one:
        step()
    many = CommDebugMode()
    with many:
        for _ in range(4):
            step()
    assert plain_counts(many.comm_module_counts) == {
        f: {p: {k: 4 * n for k, n in ops.items()} for p, ops in ph.items()} for f, ph in plain_counts(one.comm_module_counts).items()
    }
    assert many.trace.steps == 4
    for i in range(3):
        assert many.trace.collective_counts(f"FSDPTransformer.layers.{i}", "backward")[RS] == 4


# ---- sequence parallel ------------------------------------------------------------------------


def test_sequence_parallel_dropout_never_takes_the_linears_all_gather(world):
    make = lambda: tensor_parallel_transformer(ModelConfig(n_layers=2, dropout=0.0), world, sequence_parallel=True)  # noqa: E731
    ref, _ = _one_step(ReferenceMode, make)
    ours, comm = _one_step(CommDebugMode, make)
    expected = ref
    # the reduce_scatter undoing attention's input all_gather (PrepareModuleInput) runs when
    # attention's backward is finished: torch gives it to wq, whose backward ran last
    for i in range(2):
        _moved_up(expected, f"Transformer.layers.{i}.attention.wq", "backward", FUNC_RS, 1)
    _assert_same(ours, expected)
    for i in range(2):
        for linear, dropout in (("attention.wo", "attention.resid_dropout"), ("feed_forward.w2", "feed_forward.resid_dropout")):
            lin = f"Transformer.layers.{i}.{linear}"
            assert comm.trace.collective_counts(lin, "forward") == {FUNC_RS: 1}
            assert comm.trace.collective_counts(lin, "backward") == {FUNC_AG: 1}
            assert comm.trace.phase_totals(f"Transformer.layers.{i}.{dropout}", "backward") == (0, 0)
        assert comm.trace.collective_counts(f"Transformer.layers.{i}.attention", "backward")[FUNC_RS] == 1


def test_sequence_parallel_many_steps(world):
    model = tensor_parallel_transformer(ModelConfig(n_layers=2, dropout=0.0), world, sequence_parallel=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        model(_tokens()).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    one, many = CommDebugMode(), CommDebugMode()
    with one:
        step()
    with many:
        for _ in range(3):
            step()
    assert plain_counts(many.comm_module_counts) == {
        f: {p: {k: 3 * n for k, n in ops.items()} for p, ops in ph.items()} for f, ph in plain_counts(one.comm_module_counts).items()
    }


class _PassThrough(nn.Module):
    """Returns its input as is, like nn.Identity or a disabled adapter."""

    def forward(self, x):
        return x


def test_modules_returning_their_input_take_nothing(mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.Identity(), nn.Dropout(0.0), _PassThrough())
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    comm = CommDebugMode()
    with comm:
        model(torch.rand(4, 16, requires_grad=True)).sum().backward()
    for passthrough in ("Sequential.3", "Sequential.4", "Sequential.5"):
        for phase in ("forward", "backward"):
            assert comm.trace.phase_totals(passthrough, phase) == (0, 0), passthrough
    assert comm.trace.collective_counts("Sequential.2", "forward") == {AR: 1}
    assert comm.trace.collective_counts("Sequential.0", "backward") == {AR: 1}


# ---- 2-D: FSDP across dp, TP inside tp -------------------------------------------------------


def test_two_d_matches_reference_and_names_mesh_groups(world):
    make = lambda: fsdp_tp_transformer(ModelConfig(n_layers=2, dropout=0.0), dp=2, tp=4)  # noqa: E731
    ref, _ = _one_step(ReferenceMode, make)
    ours, comm = _one_step(CommDebugMode, make)
    expected = ref
    for i in range(2):
        _moved_up(expected, f"FSDPTransformer.layers.{i}.attention_norm", "backward", RS, 1)
    _moved_up(expected, "FSDPTransformer.tok_embeddings", "backward", RS, 1)
    _assert_same(ours, expected)
    labels: dict[str, set[str]] = {}
    for e in comm.trace.events:
        labels.setdefault(e.key, set()).add(e.group.label)
    # FSDP's gathers and reduce-scatters (eager c10d ops) run on the dp dimension, tensor
    # parallelism's redistributions (functional ops) on tp
    assert labels == {AG: {"mesh_dp[2]"}, RS: {"mesh_dp[2]"}, AR: {"mesh_tp[4]"}, FUNC_AG: {"mesh_tp[4]"}}
    dp = next(e.group for e in comm.trace.events if e.op == "all_gather")
    assert dp.ranks == (0, 4) and dp.desc == "mesh_dp"
    table = comm.generate_comm_debug_tracing_table(0, color=False)
    assert "*c10d._allgather_base_: 1 (" in table and ") on mesh_dp[2]" in table
    assert ") on mesh_tp[4]" in table
    # every collective line of the table names its group
    assert all(" on " in line for line in table.splitlines() if line.strip().startswith("*"))


def test_two_d_sequence_parallel_all_on_the_block_or_below(world):
    make = lambda: fsdp_tp_transformer(ModelConfig(n_layers=2, dropout=0.0), dp=2, tp=4, sequence_parallel=True)  # noqa: E731
    ours, comm = _one_step(CommDebugMode, make)
    root = "FSDPTransformer"
    total = comm.trace.phase_totals("Global", "backward")[0]
    # nothing lands outside the model, and every block's backward work is inside the block
    assert comm.trace.phase_totals(root, "backward")[0] == total
    for i in range(2):
        block = comm.trace.collective_counts(f"{root}.layers.{i}", "backward")
        assert block[RS] == 1  # its FSDP reduce-scatter
        assert block[FUNC_RS] == 2 and block[FUNC_AG] == 2  # SP: attention and feed-forward


# ---- optimizer --------------------------------------------------------------------------------


class _ZeroLikeSGD(torch.optim.SGD):
    """An optimizer that communicates inside step(), ZeRO-style: gradients averaged across
    ranks before the update, updated parameters broadcast from their owner after it."""

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        for p in params:
            dist.all_reduce(p.grad)
        out = super().step(closure)
        for p in params:
            dist.broadcast(p.data, src=0)
        return out


class _ClippingSGD(torch.optim.SGD):
    """Clips the (tensor-parallel, sharded) gradients inside step(): the global norm needs an
    all_reduce across the shards."""

    def step(self, closure=None):
        sharded = [p for g in self.param_groups for p in g["params"] if isinstance(p, DTensor)]
        torch.nn.utils.clip_grad_norm_(sharded, max_norm=1.0)
        return super().step(closure)


def test_collectives_inside_optimizer_step_are_their_own_phase(world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    opt = _ZeroLikeSGD(model.parameters(), lr=1e-3)
    comm = CommDebugMode()
    with comm:
        for _ in range(2):
            model(torch.rand(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert [(e.phase, e.op) for e in comm.trace.events if e.step == 0] == [("optimizer", "all_reduce")] * 4 + [("optimizer", "broadcast")] * 4
    assert {e.module for e in comm.trace.events} == {"Global"}
    assert comm.trace.steps == 2
    grads = [e.size_bytes for e in comm.trace.events if e.op == "all_reduce" and e.step == 0]
    assert grads == [p.numel() * 4 for p in model.parameters()]
    table = comm.generate_comm_debug_tracing_table(0, color=False)
    # 280 float32 parameters: 1,120 B a step, two steps
    assert table.startswith("Global\n  OPTIMIZER STEP\n    *c10d.allreduce_: 8 (2.19 KiB) on default_pg[8]\n    *c10d.broadcast_: 8 (2.19 KiB) on default_pg[8]\n")
    assert "FORWARD PASS" not in table
    # the drop-in view folds the optimizer into forward, as torch's CommDebugMode would
    compat = plain_counts(comm.comm_module_counts)["Global"]["forward"]
    assert compat == {"c10d.allreduce_": 8, "c10d.broadcast_": 8}


def test_clipping_inside_step_is_optimizer_not_forward(world, tp_transformer):
    model, tokens = tp_transformer()
    opt = _ClippingSGD(model.parameters(), lr=1e-3)
    comm = CommDebugMode()
    with comm:
        model(tokens).sum().backward()
        opt.step()
    (norm,) = [e for e in comm.trace.events if e.phase == "optimizer"]
    assert (norm.op, norm.module, norm.dtensor_op) == ("all_reduce", "Global", "aten.linalg_vector_norm.default")
    assert norm.source.startswith(__file__ + ":")
    # everything else is the model's own forward and backward
    assert comm.trace.phase_totals("Global", "forward") == comm.trace.phase_totals("Transformer", "forward")


# ---- DDP-style hooks --------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        return self.out(torch.relu(self.inner(x)))


def _all_reduce_grads_when_done(module: nn.Module, args: tuple) -> None:
    """A forward pre-hook that, like DDP-style per-module gradient sync, all-reduces the module's
    gradients once its backward is finished (its inputs' gradients are complete)."""

    def sync(_grads):
        for p in module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)

    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if tensors:
        register_multi_grad_hook(tensors, sync)


def test_hooks_on_a_modules_inputs_belong_to_that_module(world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), _Block(), _Block())
    for block in (model[1], model[2]):
        block.register_forward_pre_hook(_all_reduce_grads_when_done)
    comm = CommDebugMode()
    with comm:
        model(torch.rand(4, 8, requires_grad=True)).sum().backward()
    for name in ("Sequential.1", "Sequential.2"):
        events = [e for e in comm.trace.events if e.module == name]
        assert [e.op for e in events] == ["all_reduce"] * 4, name  # 2 weights + 2 biases
        assert all(e.phase == "backward" for e in events)
    # not on the child whose backward ran last, nor on the next module
    for child in ("inner", "out"):
        assert comm.trace.phase_totals(f"Sequential.1.{child}", "backward") == (0, 0)
    assert comm.trace.phase_totals("Sequential.0", "backward") == (0, 0)


class _Scaled(nn.Module):
    """Makes its block's input itself (a node of its own, outside the block)."""

    def __init__(self):
        super().__init__()
        self.block = _Block()

    def forward(self, x):
        return self.block(x * 2)


def test_hooks_on_a_modules_inputs_belong_to_it_also_when_its_parent_made_them(world):
    """A collective run by a node its parent made outside the module belongs to the parent (a
    redistribution in the parent's own forward); a hook the module put on that node's tensor, run
    before the node's own work, still belongs to the module."""
    torch.manual_seed(0)
    model = _Scaled()
    model.block.register_forward_pre_hook(_all_reduce_grads_when_done)
    comm = CommDebugMode()
    with comm:
        model(torch.rand(4, 8, requires_grad=True)).sum().backward()
    assert [(e.op, e.module, e.phase) for e in comm.trace.events] == [("all_reduce", "_Scaled.block", "backward")] * 4


def test_a_marker_hook_on_a_leaf_tensor_runs_as_register_hook_would():
    """The markers' hook without a handle takes a tensor with no autograd node, as torch's
    ``register_hook`` does: it used to reach for the missing node (None) and raise."""
    from commdebug.capture.markers import add_tensor_hook

    leaf = torch.ones(3, requires_grad=True)
    made = leaf * 3
    seen = []
    add_tensor_hook(leaf, lambda g: seen.append(("leaf", g.tolist())))
    add_tensor_hook(made, lambda g: seen.append(("made", g.tolist())))
    add_tensor_hook(made, lambda g: seen.append(("first", g.tolist())), first=True)
    (made * 2).sum().backward()
    assert seen == [("first", [2.0] * 3), ("made", [2.0] * 3), ("leaf", [6.0] * 3)]
    assert leaf.grad.tolist() == [6.0] * 3


# ---- source lines -----------------------------------------------------------------------------


def test_source_is_the_users_line_not_a_wrapper(world):
    out, inp = torch.empty(8 * 4), torch.ones(4)
    comm = CommDebugMode()
    with comm:
        dist.all_gather_into_tensor(out, inp)  # typing_extensions' @deprecated wraps this
        dist.all_reduce(inp)
    here = __file__
    assert [e.source.rsplit(":", 1)[0] for e in comm.trace.events] == [here, here]
    lines = open(here).read().splitlines()
    assert "dist.all_gather_into_tensor(out, inp)" in lines[int(comm.trace.events[0].source.rsplit(":", 1)[1]) - 1]
