"""torch.compile'd programs under CommDebugMode: they stay compiled (no eager fallback, no graph
the mode causes, ``fullgraph=True`` runs), and what the compiled code issues is recorded, marked
``compiled``, on the compiled block and phase that eager attributes it to.

A 2-block tensor-parallel MLP in the fake 8-rank world, compiled per block. One test compiles
with Inductor (its in-place ``all_reduce_`` is what compiled code issues; about 10-30 s on CPU
the first time); the others use ``aot_eager``, which runs the same AOTAutograd forward and
backward graphs without generating kernels.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch._dynamo.utils import counters
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import commdebug
from commdebug import CommDebugMode
from commdebug.analysis.diff import diff_traces
from commdebug.model.trace import BACKWARD, FORWARD
from commdebug.render.diff import render_diff

BLOCKS = ("Net.blocks.0", "Net.blocks.1")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([MLP() for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _net(mesh) -> Net:
    torch.manual_seed(0)
    net = Net()
    for block in net.blocks:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return net


def _compile(net: Net, how: str, backend: str) -> Net:
    for i, block in enumerate(net.blocks):
        if how == "module.compile":
            block.compile(backend=backend, fullgraph=True)
        else:
            net.blocks[i] = torch.compile(block, backend=backend, fullgraph=True)
    return net


_X = torch.randn(8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)


def _steps(net: Net, n: int = 2) -> None:
    for _ in range(n):
        net(_X).sum().backward()


def _record(net: Net, **options) -> CommDebugMode:
    with CommDebugMode(**options) as comm:
        _steps(net)
    return comm


def _user_line(text: str) -> str:
    """``file:line`` of the line of this file that ends with ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"{__file__}:{next(i for i, line in enumerate(lines, 1) if line.endswith(text))}"


# a compiled block's collectives name the user's line that called the block (forward) or ran
# the backward, as eager names the user's line: not the block's def line, nor generated code
CALLS_BLOCK, RUNS_BACKWARD = _user_line("x = block(x)"), _user_line("net(_X).sum().backward()")


def _sources_are_the_callers(comm: CommDebugMode) -> bool:
    return all(e.source == (CALLS_BLOCK if e.phase == FORWARD else RUNS_BACKWARD) for e in comm.trace.events)


def _per_block(comm: CommDebugMode) -> dict:
    """Each block's forward and backward collective counts (its submodules' included)."""
    return {(fqn, phase): sum(s.count for s in comm.trace.collective_stats(fqn, phase)) for fqn in BLOCKS for phase in (FORWARD, BACKWARD)}


def _multiset(comm: CommDebugMode) -> Counter:
    return Counter((e.op, e.module, e.phase, e.group.name, e.size_bytes, e.step) for e in comm.trace.events)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.proc
def test_inductor_blocks_compiled_outside_stay_compiled_and_count_as_eager(mesh, fresh_dynamo, tmp_path):
    """Compiled (Inductor, fullgraph) and run once before the recording: under the full and the
    light capture the program runs the same compiled code (no new graph), each block's forward
    and backward counts equal eager's, and every collective is Inductor's in-place all_reduce_,
    marked compiled in the event, the JSON dump, the table and its header."""
    eager = _per_block(_record(_net(mesh)))
    net = _compile(_net(mesh), "module.compile", "inductor")
    _steps(net, 1)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # it really compiled

    full = _record(net)
    light = _record(net, light=True)
    assert counters["stats"]["unique_graphs"] == graphs  # the mode caused no recompilation
    assert not counters["graph_break"]
    for comm in (full, light):
        assert _per_block(comm) == eager
        events = list(comm.trace.events)
        assert events and all(e.compiled for e in events)
        assert {e.aten_op for e in events} == {"_c10d_functional.all_reduce_.default"}
        assert _sources_are_the_callers(comm)
    assert _multiset(full) == _multiset(light)

    full.generate_json_dump(str(tmp_path / "compiled.json"))
    loaded = commdebug.load(tmp_path / "compiled.json")
    assert all(e.compiled for e in loaded.events)
    assert json.loads((tmp_path / "compiled.json").read_text())["commdebug"]["metadata"]["compile_notes"]
    table = full.generate_comm_debug_tracing_table(noise_level=1)
    assert table.splitlines()[0].startswith("torch.compile: collectives issued by compiled code are marked (compiled)")
    assert "*c10d_functional.all_reduce: 2 (1.00 KiB) on default_pg[8] (compiled)" in table
    # level 0 stays the reference's layout
    assert "(compiled)" not in full.generate_comm_debug_tracing_table(noise_level=0)


@pytest.mark.parametrize("how", ["module.compile", "torch.compile"])
def test_blocks_compiled_inside_the_recording_run_fullgraph_and_count_as_eager(mesh, fresh_dynamo, how):
    """Compiled on the first call inside the recording (fullgraph=True, which the mode used to
    break): one graph, no graph break, each block's counts equal eager's, every collective
    compiled; ``torch.compile(block)`` shows the block's own class, not the wrapper's."""
    eager = _per_block(_record(_net(mesh)))
    comm = _record(_compile(_net(mesh), how, "aot_eager"))
    assert counters["stats"]["unique_graphs"] == 1  # both blocks share one graph
    assert not counters["graph_break"]
    assert _per_block(comm) == eager
    assert all(e.compiled for e in comm.trace.events) and _sources_are_the_callers(comm)
    assert {comm.trace.modules[b].module_type for b in BLOCKS} == {f"class '{__name__}.MLP'"}


def test_light_capture_of_a_model_compiled_inside_records_what_full_does(mesh, fresh_dynamo):
    full = _record(_compile(_net(mesh), "module.compile", "aot_eager"))
    torch._dynamo.reset()
    light = _record(_compile(_net(mesh), "module.compile", "aot_eager"), light=True)
    assert _multiset(light) == _multiset(full) and all(e.compiled for e in light.trace.events)


def test_a_function_compiled_inside_a_light_recording_traces_module_calls_through_its_wrapper(mesh, fresh_dynamo):
    """``torch.compile(fn)`` of a function that calls the model: Dynamo traces light capture's
    ``Module.__call__`` (a Python function in front of its C side) and reads it as torch's own,
    so the whole model is one graph (fullgraph: a graph break would raise) and every collective
    is recorded, compiled, as many as eager issues."""
    eager = _record(_net(mesh), light=True)
    net = _net(mesh)
    run = torch.compile(lambda x: net(x), backend="aot_eager", fullgraph=True)
    with CommDebugMode(light=True) as comm:
        for _ in range(2):
            run(_X).sum().backward()
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1
    assert len(comm.trace.events) == len(eager.trace.events) > 0 and all(e.compiled for e in comm.trace.events)
    assert Counter((e.op, e.phase, e.size_bytes) for e in comm.trace.events) == Counter((e.op, e.phase, e.size_bytes) for e in eager.trace.events)


def test_diff_of_eager_and_compiled_shows_no_change_when_compilation_changed_nothing(mesh, fresh_dynamo):
    """Eager puts the calls on the Linear layers, compiled on the block that hides them: diff
    counts both at the block, so compiling the blocks is no difference; dropping a block's
    backward all_reduce is one."""
    eager = _record(_net(mesh)).trace
    compiled = _record(_compile(_net(mesh), "module.compile", "aot_eager")).trace
    found = diff_traces(eager, compiled)
    assert not found and found.rolled_up > 0
    assert "counted at their nearest module both sides have" in render_diff(found, "eager.json", "compiled.json")

    net = _compile(_net(mesh), "module.compile", "aot_eager")
    with CommDebugMode() as once:  # one step instead of two: every block's count halves
        _steps(net, 1)
    changed = diff_traces(eager, once.trace)
    assert {(c.module, c.phase, c.calls) for c in changed.changes} == {
        (block, phase, (2, 1)) for block in BLOCKS for phase in (FORWARD, BACKWARD)}


def test_a_whole_model_compiled_with_torch_compile_is_named_by_its_class(mesh, fresh_dynamo):
    net = torch.compile(_net(mesh), backend="aot_eager", fullgraph=True)
    comm = _record(net)
    assert {e.module for e in comm.trace.events} == {"Net"} and all(e.compiled for e in comm.trace.events)
    assert comm.trace.modules["Net"].module_type == f"class '{__name__}.Net'"


def test_async_tp_fused_ops_are_collectives_with_their_message_size():
    """Async tensor parallelism's symmetric-memory ops (CUDA only, so not run here) are in the
    registry: an all-gather whose S is the gathered input, a reduce-scatter whose S is the
    whole product, both finished when they return."""
    from commdebug import ops

    gather = ops.lookup(torch.ops.symm_mem.fused_all_gather_matmul)
    scatter = ops.lookup(torch.ops.symm_mem.fused_matmul_reduce_scatter)
    a = torch.empty(4, 8)  # 128 bytes on each of 4 ranks
    assert (gather.op, gather.returns_done) == ("all_gather", True)
    in_bytes = ops.tensor_bytes(ops.pick(gather.inputs, (a, [a], 0, "0"), {}, None))[0]
    assert ops.MESSAGE_SIZE[gather.size](in_bytes, 0, 4) == 512
    assert (scatter.op, scatter.returns_done) == ("reduce_scatter", True)
    out_bytes = ops.tensor_bytes(ops.pick(scatter.outputs, (a, a, "sum", 0, "0"), {}, a))[0]
    assert ops.MESSAGE_SIZE[scatter.size](0, out_bytes, 4) == 512


def test_the_dispatch_mode_leaves_dynamos_frame_callback_alone_unless_compiled_code_set_one(monkeypatch):
    """Outside code that torch.compile runs, no Dynamo frame callback is set, and the full
    capture's ``__torch_dispatch__`` runs without torch's disabling wrapper (two
    ``set_eval_frame`` calls per op, 5% of a tensor-parallel step); where one is set, the
    wrapper clears it for the call, so Dynamo never traces the mode."""
    import torch._dynamo.eval_frame as eval_frame

    from commdebug.capture import loaded

    callbacks_seen: list[object] = []
    cleared: list[object] = []
    set_eval_frame = eval_frame.set_eval_frame

    def counted(callback):
        cleared.append(callback)
        return set_eval_frame(callback)

    def dispatch(x):
        callbacks_seen.append(torch._C._dynamo.eval_frame.get_eval_frame_callback())
        return x + 1

    monkeypatch.setattr(eval_frame, "set_eval_frame", counted)
    assert loaded.skip_dynamo_lazily(dispatch)(1) == 2
    assert cleared == [] and callbacks_seen == [None]

    # a thread inside compiled code, as the getter reports it
    monkeypatch.setattr(loaded, "_callback_getter", lambda: lambda: "a callback")
    assert loaded.skip_dynamo_lazily(dispatch)(1) == 2
    assert None in cleared and callbacks_seen == [None, None]
