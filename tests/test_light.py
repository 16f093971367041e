"""Light capture (``CommDebugMode(light=True)``, ``detail_every=N``, ``commdebug run --light``):
every collective recorded without a TorchDispatchMode on the stack. What a user sees must not
change: the same collectives, attributed to the same module, phase, group, size and step, with
the same sequence numbers, as under the full capture; and no dispatch mode in the program while
a light step runs. ``detail_every`` gives the DTensor op behind a collective on every Nth step.

Every workload runs in the fake 8-rank world, except a pipelining schedule (2 spawned gloo
ranks) and one real `commdebug run --light` job under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import _get_current_dispatch_mode

import commdebug
from commdebug import CommDebugMode
from commdebug.demo import ModelConfig, fsdp_transformer, tensor_parallel_transformer

import gloo_worker
from test_multiprocess import spawn_ranks

ROOT = Path(__file__).resolve().parents[1]
LIGHT_JOB = ROOT / "tests" / "programs" / "light_job.py"
DEADLINE_S = 60


def _key(e) -> tuple:
    """What a user reads off an event, independent of how it was captured."""
    return (e.op, e.module, e.phase, e.group.name, e.size_bytes, e.step)


def _order(e) -> tuple:
    """An event's place in its group's order: collectives by seq, send/recv by peer and p2p_seq."""
    return (e.group.name, e.op, e.seq, e.peer, e.p2p_seq, e.size_bytes)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))


def _record(make, body, **options) -> tuple[CommDebugMode, list]:
    """Build a fresh workload, run ``body(model, comm)`` under ``CommDebugMode(**options)``;
    returns the mode and the dispatch mode seen at every module forward while recording."""
    model = make()
    modes: list = []
    hook = torch.nn.modules.module.register_module_forward_hook(lambda *_: modes.append(_get_current_dispatch_mode()))
    try:
        comm = CommDebugMode(**options)
        with comm:
            body(model, comm)
    finally:
        hook.remove()
    return comm, modes


def _full_and_light(make, body) -> tuple[list, list]:
    full, full_modes = _record(make, body)
    light, light_modes = _record(make, body, light=True)
    assert full.trace.metadata["capture"] == "full" and light.trace.metadata["capture"] == "light"
    # the light run really ran without the dispatch mode, the full one with it
    assert full_modes and all(m is full for m in full_modes)
    assert light_modes and all(m is None for m in light_modes), f"a dispatch mode was active during a light step: {set(map(type, light_modes))}"
    assert full.trace.events_dropped == light.trace.events_dropped == 0
    return list(full.trace.events), list(light.trace.events)


def _assert_same_collectives(full: list, light: list) -> None:
    assert full, "the workload issued no collective: the comparison would prove nothing"
    a, b = Counter(map(_key, full)), Counter(map(_key, light))
    assert a == b, (
        "light capture records different collectives from full capture "
        "(op, module, phase, group, size_bytes, step): "
        f"only under full: {dict(a - b)}; only under light: {dict(b - a)}"
    )
    assert [_order(e) for e in full] == [_order(e) for e in light], "same collectives, different order or sequence numbers"


# ---- the workloads (fake 8-rank world) ---------------------------------------------------------


def _tp_mlp(mesh):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    return parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _train(steps: int, inputs):
    """``steps`` forward + backward + optimizer steps (the optimizer marks the steps)."""

    def body(model, comm):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            model(inputs()).sum().backward()
            opt.step()
            opt.zero_grad()

    return body


class _Eager(torch.nn.Module):
    """Plain c10d calls from inside a forward (metrics, buffers kept in sync), and an all_reduce
    of its output gradient from a backward hook."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.register_full_backward_hook(lambda mod, grad_in, grad_out: dist.all_reduce(grad_out[0].detach().clone()))

    def forward(self, x):
        y = self.fc(x)
        t = y.detach().clone()
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.barrier()
        dist.all_gather_into_tensor(torch.empty(dist.get_world_size() * t.numel()), t.flatten())
        return y


class _EagerModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Eager()
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.inner(x))


def _eager_body(model, comm):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.ones(2, 8, requires_grad=True)).sum().backward()
        dist.all_reduce(torch.ones(3))  # outside any module
        opt.step()
        opt.zero_grad()


def _fsdp_body(model, comm):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(_tokens()).sum().backward()
        opt.step()
        opt.zero_grad()


class _ReentrantTP(torch.nn.Module):
    """Two TP MLP blocks under reentrant activation checkpointing: their forward runs again,
    with gradients, inside the backward (a nested backward on the recomputed graph)."""

    def __init__(self, mesh) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_tp_mlp(mesh) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
        return x


class _GatherInsideForward(torch.nn.Module):
    """torchtitan's sequence-parallel feed-forward: the block all-gathers its Shard(1) input in
    its own forward, not in a pre-hook, for two column-parallel children. That all-gather's
    backward, a reduce-scatter, runs after both children's backward and before any marker of
    the block's is reached."""

    def __init__(self, mesh) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mesh = mesh
        self.w1, self.w3 = torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(16, 32, bias=False)
        self.w2 = torch.nn.Linear(32, 16, bias=False)
        parallelize_module(self, mesh, {"w1": ColwiseParallel(use_local_output=False), "w3": ColwiseParallel(use_local_output=False),
                                        "w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})

    def forward(self, x):
        h = x.redistribute(self.mesh, [Replicate()])
        return self.w2(torch.nn.functional.silu(self.w1(h)) * self.w3(h))


def _sequence_sharded(mesh):
    return lambda: DTensor.from_local(torch.ones(2, 1, 16, requires_grad=True), mesh, [Shard(1)])


WORKLOADS = {
    # workload -> (make(mesh), body, ops a correct capture records)
    "tp_mlp": (lambda mesh: _tp_mlp(mesh), _train(3, lambda: torch.ones(4, 16, requires_grad=True)), {"all_reduce"}),
    # with SGD: the all_reduce of each Partial norm gradient runs inside DTensor's aten.add_
    # (the optimizer update), as in test_light_records_the_redistribution_inside_a_dtensor_op
    "tp_sequence_parallel_transformer": (
        lambda mesh: tensor_parallel_transformer(ModelConfig(n_layers=2), mesh.size(), sequence_parallel=True, mesh=mesh),
        _train(2, _tokens), {"all_gather", "reduce_scatter"}),
    "fsdp2_adamw": (
        lambda mesh: fsdp_transformer(ModelConfig(n_layers=2), mesh=mesh),
        _fsdp_body, {"all_gather", "reduce_scatter"}),
    "eager_c10d_in_modules": (lambda mesh: _EagerModel(), _eager_body, {"all_reduce", "broadcast", "barrier", "all_gather"}),
    # activation checkpointing: the recompute's collectives (phase "checkpoint") and the
    # backward of the recomputed graph, non-reentrant and reentrant
    "tp_sequence_parallel_checkpointed": (
        lambda mesh: tensor_parallel_transformer(ModelConfig(n_layers=2, checkpoint_layers=True), mesh.size(), sequence_parallel=True, mesh=mesh),
        _train(2, _tokens), {"all_gather", "reduce_scatter"}),
    "fsdp2_checkpointed": (
        lambda mesh: fsdp_transformer(ModelConfig(n_layers=2, checkpoint_layers=True), mesh=mesh),
        _fsdp_body, {"all_gather", "reduce_scatter"}),
    "gather_inside_a_block_forward": (lambda mesh: torch.nn.Sequential(_GatherInsideForward(mesh)), None, {"all_gather", "reduce_scatter"}),
    "tp_reentrant_checkpoint": (lambda mesh: _ReentrantTP(mesh), _train(2, lambda: torch.ones(4, 16, requires_grad=True)), {"all_reduce"}),
}


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_light_records_the_same_collectives_as_full(workload, mesh):
    make, body, ops = WORKLOADS[workload]
    body = body or _train(2, _sequence_sharded(mesh))
    full, light = _full_and_light(lambda: make(mesh), body)
    _assert_same_collectives(full, light)
    assert {e.op for e in light} >= ops
    assert {e.step for e in light} >= {0, 1}  # several steps, each recorded
    if workload.startswith("tp_") and "checkpoint" in workload:  # (FSDP2 recomputes gathered)
        assert {e.phase for e in light} >= {"checkpoint", "backward"}


@pytest.mark.parametrize("workload", ["tp_sequence_parallel_checkpointed", "fsdp2_checkpointed", "eager_c10d_in_modules", "tp_reentrant_checkpoint"])
def test_module_calls_tracked_in_c_place_collectives_as_the_python_wrapper_does(workload, mesh, monkeypatch):
    """Light steps' ``Module.__call__`` runs its common case in C (``_native.ModuleCalls``): a
    module seen under the same parent before. Every other call, and every call where the
    extension is not built, goes through the Python wrapper: both must place each collective
    alike, and the C side must really take the common case."""
    from commdebug.capture import calls

    if calls._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    make, body, _ = WORKLOADS[workload]
    body = body or _train(2, _sequence_sharded(mesh))
    python_calls = []
    wrapper = calls.CallTracking._call
    monkeypatch.setattr(calls.CallTracking, "_call", lambda self, *a: python_calls.append(1) or wrapper(self, *a))
    in_c, _ = _record(lambda: make(mesh), body, light=True)
    in_c_modules, c_fallbacks = sorted(in_c.trace.modules), len(python_calls)
    monkeypatch.setattr(calls, "_native", None)
    python_calls.clear()
    in_python, _ = _record(lambda: make(mesh), body, light=True)
    _assert_same_collectives(list(in_python.trace.events), list(in_c.trace.events))
    assert [e.module for e in in_c.trace.events] == [e.module for e in in_python.trace.events]
    assert in_c_modules == sorted(in_python.trace.modules)
    assert c_fallbacks < len(python_calls), "the C side took no call"


def _without_cpp_recording(monkeypatch) -> None:
    """Light capture with the C++ kernel, but every call recorded by its Python handler."""
    from commdebug.capture import light

    if light._native is not None:
        monkeypatch.setattr(light, "_innermost_to_native", lambda: light._native.set_recorder(None))


def _fields(e) -> dict:
    """Everything an event says but when it was issued (two runs' clocks differ)."""
    fields = e._asdict()
    fields.pop("start_s")
    return fields


@pytest.mark.parametrize("workload", ["eager_c10d_in_modules", "fsdp2_checkpointed", "tp_sequence_parallel_checkpointed", "tp_mlp"])
def test_collectives_recorded_in_cpp_are_the_events_the_python_handler_records(workload, mesh, monkeypatch):
    """Light capture's C++ kernel records a plain call itself (record_fast in _native.cpp) from
    facts the Python path worked out on the op's first call on its group: every field of every
    event (module, phase, step, group, seq, shapes, bytes, source line...) must be what the
    Python handler records, and the C++ side must really take calls."""
    from commdebug.capture import light

    if light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    make, body, _ = WORKLOADS[workload]
    before = sum(light._native.counts())
    in_cpp, _ = _record(lambda: make(mesh), body, light=True)
    taken = sum(light._native.counts()) - before
    _without_cpp_recording(monkeypatch)
    in_python, _ = _record(lambda: make(mesh), body, light=True)
    assert sum(light._native.counts()) - before == taken, "the Python handler's run was recorded in C++"
    assert taken > len(in_cpp.trace.events) // 2, f"the C++ side recorded {taken} of {len(in_cpp.trace.events)} calls"
    assert [_fields(e) for e in in_cpp.trace.events] == [_fields(e) for e in in_python.trace.events]
    assert in_cpp.trace.collectives == in_python.trace.collectives
    assert in_cpp.in_flight() == in_python.in_flight() == []


@pytest.mark.parametrize("workload", ["tp_sequence_parallel_transformer", "tp_sequence_parallel_checkpointed"])
def test_the_cpp_kernel_reads_a_known_line_and_module_without_asking_python(workload, mesh, monkeypatch):
    """Once a collective's line has been named and every file on the way classified, the C++
    kernel finds the line (known_source) and, in forward and in a light step's backward, the
    module (known_where, with the module calls' ranges searched in C++ once the forward's log
    is folded) itself: Python's ``caller``, ``where`` and ``NodeRanges.find`` are asked only
    for what is new (an op's first calls, a backward's first collective, checkpoint
    recomputation). A functional collective's wait is told to the in-flight table in C++ too
    (``_native.waited``), not by ``InFlight.tensor_waited``. That the answers are the Python
    path's is the test above, on the same workloads."""
    from commdebug.capture import calls, inflight, light, recorder, tracker

    if light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    asked = Counter()
    caller, where = recorder.caller, tracker.ModuleTracker.where
    # one frame deeper than asked: the spy's own frame is not the program's
    monkeypatch.setattr(recorder, "caller", lambda depth=1: asked.update(["caller"]) or caller(depth + 1))
    monkeypatch.setattr(tracker.ModuleTracker, "where", lambda self: asked.update(["where"]) or where(self))
    find = calls.NodeRanges.find
    monkeypatch.setattr(calls.NodeRanges, "find", lambda self, number: asked.update(["find"]) or find(self, number))
    told = inflight.InFlight.tensor_waited
    monkeypatch.setattr(inflight.InFlight, "tensor_waited", lambda self, *a: asked.update(["told"]) or told(self, *a))
    make, body, _ = WORKLOADS[workload]
    before = sum(light._native.counts())
    comm, _ = _record(lambda: make(mesh), body or _train(2, _sequence_sharded(mesh)), light=True)
    in_cpp = sum(light._native.counts()) - before
    events = list(comm.trace.events)
    assert in_cpp > len(events) // 2 and {e.phase for e in events} >= {"forward", "backward"}
    assert all(e.source and "test_light.py" in e.source for e in events), {e.source for e in events}
    assert asked["caller"] < in_cpp // 2, f"Python named the line of {asked['caller']} of {in_cpp} calls recorded in C++"
    assert asked["where"] < in_cpp // 2, f"Python located {asked['where']} of {in_cpp} calls recorded in C++"
    backward = sum(e.phase == "backward" for e in events)
    assert asked["find"] < backward // 2, f"Python searched the module calls for {asked['find']} of {backward} backward calls"
    assert asked["told"] < in_cpp // 2, f"Python was told of {asked['told']} waits of {in_cpp} calls recorded in C++"
    assert comm.in_flight() == []


@pytest.mark.parametrize("options", [{"light": True}, {}], ids=["light", "full"])
def test_recorded_events_are_not_tracked_by_the_garbage_collector(mesh, options):
    """An event can be in no reference cycle (it holds strings, numbers and tuples of them), so
    the collector need not walk the 20,000 a long recording keeps: tracked, they alone set off
    full collections of the whole heap every few hundred steps of a training loop."""
    import gc

    from commdebug.capture import light

    if light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    comm, _ = _record(lambda: _tp_mlp(mesh), _train(2, lambda: torch.ones(4, 16, requires_grad=True)), **options)
    events = list(comm.trace.events)
    assert events and not any(gc.is_tracked(e) for e in events)
    assert events[0].group.name and events[-1]._replace(latency_s=1.0).latency_s == 1.0  # still a plain event


@pytest.mark.parametrize("in_cpp", [True, False])
def test_a_collective_whose_backend_raises_is_recorded_failed_and_raises_unchanged(world, monkeypatch, in_cpp):
    """A call the backend fails (here a CPU kernel standing in for gloo's error) is in the
    record, failed with the error's first line, and the program gets the error it would get
    without commdebug; the calls after it are recorded as before."""
    from commdebug.capture import light

    if in_cpp and light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    if not in_cpp:
        _without_cpp_recording(monkeypatch)

    def refuse(*args, **kwargs):
        raise RuntimeError("[gloo] connection closed by peer\nmore detail")

    before = sum(light._native.counts()) if light._native is not None else 0
    with CommDebugMode(light=True) as comm:
        dist.all_reduce(torch.ones(2))  # the op's first call on the group: worked out by Python
        backend = torch.library.Library("c10d", "IMPL")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # replacing torch's kernel warns
                backend.impl("allreduce_", refuse, "CPU")
            with pytest.raises(RuntimeError, match="connection closed by peer") as raised:
                dist.all_reduce(torch.ones(3))
        finally:
            backend._destroy()
        dist.all_reduce(torch.ones(4))
    assert "more detail" in str(raised.value)
    assert [(e.seq, e.size_bytes, e.error) for e in comm.trace.events] == [
        (0, 8, None), (1, 12, "RuntimeError: [gloo] connection closed by peer"), (2, 16, None)]
    assert comm.in_flight() == []
    if light._native is not None:
        assert (sum(light._native.counts()) - before > 0) == in_cpp


@pytest.mark.parametrize("options", [{"light": True}, {"light": True, "timing": "sync"}, {}, {"timing": "sync"}, {"detail_every": 1}],
                         ids=["light", "light-sync", "full", "full-sync", "detail-step"])
def test_an_error_torch_raises_in_a_collective_reaches_the_program_without_commdebugs_frames(world, monkeypatch, options):
    """The program's traceback of a failed collective has no frame of commdebug's, whichever
    path recorded the call (light's C++ kernel or its Python handler, the dispatch mode, a detail
    step's dispatch mode under light's kernels), and where the mode's own ``timing='sync'`` wait
    is what raised. Under light capture it is the
    traceback the program has without commdebug; a dispatch mode adds torch's ``OpOverload``
    frame it calls the op through."""
    import traceback

    from commdebug.capture import recorder as recorder_module

    def refuse(*args, **kwargs):
        raise RuntimeError("[gloo] connection closed by peer")

    def frames(call) -> list[tuple[str, str]]:
        try:
            call()
        except RuntimeError as e:
            return [(f.filename, f.name) for f in traceback.extract_tb(e.__traceback__)]
        raise AssertionError("the collective did not raise")

    def failing_call() -> list[tuple[str, str]]:
        backend = torch.library.Library("c10d", "IMPL")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # replacing torch's kernel warns
                backend.impl("allreduce_", refuse, "CPU")
            return frames(lambda: dist.all_reduce(torch.ones(3)))
        finally:
            backend._destroy()

    package = str(ROOT / "commdebug")
    bare = failing_call()
    assert bare[-1][1] == "refuse" and any(name == "all_reduce" for _, name in bare)
    with CommDebugMode(**options) as comm:
        dist.all_reduce(torch.ones(2))  # the op's first call on its group
        recorded = failing_call()
    if options.get("light"):
        assert recorded == bare
    else:  # a dispatch mode: on a detail step, under light's kernels too
        assert comm.trace.metadata.get("detail_steps", [0]) == [0]
        assert [f for f in recorded if not f[0].endswith("torch/_ops.py")] == bare, recorded
    assert comm.trace.events[-1].error == "RuntimeError: [gloo] connection closed by peer"
    if options.get("timing") != "sync":
        return

    def broken_wait(*args, **kwargs):  # torch's wait raising, as gloo's does when a peer dies
        raise RuntimeError("[gloo] connection closed by peer")

    monkeypatch.setattr(recorder_module, "wait_until_finished", broken_wait)
    with CommDebugMode(**options) as comm:
        waited = frames(lambda: dist.all_reduce(torch.ones(2)))
    assert not [f for f in waited if f[0].startswith(package) and f[1] != "broken_wait"], waited
    assert waited[-1][1] == "broken_wait" and waited[-2][1] == "all_reduce", waited
    assert comm.trace.events[-1].error == "RuntimeError: [gloo] connection closed by peer"


def test_an_error_in_an_op_under_the_dispatch_mode_has_no_commdebug_frames_but_our_own_error_keeps_them(monkeypatch):
    """A shape error in the program's model, under the full capture: the traceback is the one it
    has without commdebug, plus torch's ``OpOverload.__call__`` that the mode runs the op through.
    An error raised by commdebug's own code keeps its frames: that one is ours to find."""
    import traceback

    from commdebug.capture import recorder as recorder_module

    def frames() -> list[tuple[str, str]]:
        try:
            torch.mm(torch.ones(2, 3), torch.ones(2, 3))
        except (RuntimeError, TypeError) as e:
            return [(f.filename, f.name) for f in traceback.extract_tb(e.__traceback__)]
        raise AssertionError("torch.mm did not raise")

    bare = frames()
    with CommDebugMode():
        recorded = frames()
    assert [f for f in recorded if not f[0].endswith("torch/_ops.py")] == bare, recorded

    from commdebug.units import format_bytes

    monkeypatch.setattr(recorder_module, "_FUNC_INFO", {})
    monkeypatch.setattr(recorder_module, "_describe", format_bytes)  # a bug of ours: it raises inside commdebug
    with CommDebugMode():
        ours = frames()
    assert any(f[0].endswith("commdebug/capture/recorder.py") for f in ours), ours


@pytest.mark.parametrize("in_cpp", [True, False])
def test_a_call_not_waited_for_shows_in_flight_until_its_wait(world, monkeypatch, in_cpp):
    """What `watch` and `check` read at a hang: a functional collective and an eager one issued
    with ``async_op=True`` are in flight until the program waits for them, whichever side
    recorded them (the C++ kernel tracks the eager one by its Work's address and the functional
    one by its output's storage, as the waits find them)."""
    import torch.distributed._functional_collectives as funcol

    from commdebug.capture import light

    if in_cpp and light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    if not in_cpp:
        _without_cpp_recording(monkeypatch)
    group = dist.group.WORLD
    before = sum(light._native.counts()) if light._native is not None else 0
    with CommDebugMode(light=True) as comm:
        funcol.all_reduce(torch.ones(2), "sum", group).wait()  # first calls: worked out by Python
        dist.all_reduce(torch.ones(2), async_op=True).wait()
        pending = funcol.all_reduce(torch.ones(3), "sum", group)
        work = dist.all_reduce(torch.ones(4), async_op=True)
        stuck = sorted((e.op, e.aten_op, e.size_bytes) for e, _ in comm.in_flight())
        pending.wait()
        half = [e.size_bytes for e, _ in comm.in_flight()]
        work.wait()
        assert comm.in_flight() == []
    assert stuck == [("all_reduce", "_c10d_functional.all_reduce.default", 12), ("all_reduce", "c10d.allreduce_.default", 16)]
    assert half == [16]
    if light._native is not None:
        assert sum(light._native.counts()) - before == (2 if in_cpp else 0)


def test_a_recording_that_ends_while_another_thread_is_inside_a_collective_keeps_it(world):
    """The C++ kernel runs the op without the GIL: the recording may end meanwhile (its context
    exits on another thread). The call in progress finishes with the state it started with (no
    crash, no use of what the ending released) and is in that recording's record; the next
    recording starts clean."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def slow(tensors, *args):  # the backend, blocked until the recording has ended
        entered.set()
        assert release.wait(DEADLINE_S)
        done = torch.futures.Future()
        done.set_result(tensors)
        return tensors, torch._C._distributed_c10d._create_work_from_future(done).boxed()

    errors: list[BaseException] = []
    comm = CommDebugMode(light=True)
    comm.__enter__()
    dist.all_reduce(torch.ones(2))  # the op's first call on the group: worked out by Python
    backend = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replacing torch's kernel warns
        backend.impl("allreduce_", slow, "CPU")

    def issue() -> None:
        try:
            dist.all_reduce(torch.ones(3))
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    thread = threading.Thread(target=issue)
    try:
        thread.start()
        assert entered.wait(DEADLINE_S), "the collective never reached the backend"
        comm.__exit__(None, None, None)  # the recording ends while the call runs
        release.set()
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
    finally:
        release.set()
        backend._destroy()
    assert errors == []
    assert [e.size_bytes for e in comm.trace.events] == [8, 12]
    with CommDebugMode(light=True) as after:
        dist.all_reduce(torch.ones(4))
    assert [e.size_bytes for e in after.trace.events] == [16]


class _Many(torch.nn.Module):
    def forward(self, *args, scale=1.0, **named):
        dist.all_reduce(args[0])
        return sum(args) * scale + sum(named.values())


class _Fails(torch.nn.Module):
    def forward(self, x):
        raise ValueError(f"no {x.shape[0]}")


class _Parent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.many, self.fails = _Many(), _Fails()

    def forward(self, x):
        y = self.many(*[x.clone() for _ in range(9)], scale=2.0, extra=x) + self.many(x.clone())
        with pytest.raises(ValueError, match="no 4"):
            self.fails(x)
        dist.all_reduce(y)  # after a child raised: the parent's, not the child's
        return y


@pytest.mark.parametrize("in_c", [True, False])
def test_module_calls_pass_every_argument_and_unwind_after_an_error(world, monkeypatch, in_c):
    """What the module-call wrapper must do whichever side runs it (C: every call after a
    module's first): pass positional and keyword arguments as they came, more than its stack
    buffer holds too, let the module's error through unchanged, and leave the module stack as
    it found it."""
    from commdebug.capture import calls

    if in_c and calls._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    if not in_c:
        monkeypatch.setattr(calls, "_native", None)
    parent, x = _Parent(), torch.ones(4)
    with CommDebugMode(light=True) as comm:
        outs = [parent(x) for _ in range(3)]
        assert comm._tracker.stack == [] and comm._tracker.paths == []
    # all_reduce of one rank's ones in the fake world leaves them: 9 x 2 + 1, plus 1
    assert all(torch.equal(out, torch.full((4,), 20.0)) for out in outs)
    assert [e.module for e in comm.trace.events] == ["_Parent.many", "_Parent.many", "_Parent"] * 3


class _Raises(torch.nn.Module):
    def forward(self, x):
        raise ValueError("bad batch")


class _Calls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Raises()

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("in_c", [True, False])
def test_an_error_in_a_module_has_the_traceback_it_has_without_commdebug(world, monkeypatch, in_c):
    """A light step wraps every module call; an error raised in a module's forward still carries
    the traceback the program has without commdebug (docs/ranks.md: what ``commdebug run``
    prints): torch's own frames, none of the wrapper's, on a module's first call (the Python
    wrapper) and on later ones (the C side)."""
    import traceback

    from commdebug.capture import calls

    if in_c and calls._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    if not in_c:
        monkeypatch.setattr(calls, "_native", None)
    model = _Calls()

    def frames() -> list[tuple[str, str]]:
        try:
            model(torch.ones(2))
        except ValueError as e:
            return [(Path(f.filename).name, f.name) for f in traceback.extract_tb(e.__traceback__)]
        raise AssertionError("the module did not raise")

    bare = frames()
    assert bare[-1] == ("test_light.py", "forward") and ("module.py", "_call_impl") in bare
    with CommDebugMode(light=True) as comm:
        recorded = [frames() for _ in range(2)]
        assert comm._tracker.stack == []
    assert recorded == [bare, bare]



def test_light_with_an_ops_filter_records_what_full_does_and_locates_no_other(world, monkeypatch):
    """``ops`` keeps the same collectives under light as under full; the ones it leaves out are
    run without being located (the cheapest a light recording can be)."""
    from commdebug.capture.tracker import ModuleTracker

    full, _ = _record(_EagerModel, _eager_body, ops=["all_reduce"])
    located = []
    location = ModuleTracker.location
    monkeypatch.setattr(ModuleTracker, "location", lambda self: located.append(1) or location(self))
    light, _ = _record(_EagerModel, _eager_body, ops=["all_reduce"], light=True)
    _assert_same_collectives(list(full.trace.events), list(light.trace.events))
    assert {e.op for e in light.trace.events} == {"all_reduce"}
    # _EagerModel issues broadcast, barrier and all_gather besides: none was located
    assert len(located) == len(light.trace.events) == 9  # three all_reduces a step


def test_a_reduce_scatter_undoing_a_blocks_own_all_gather_belongs_to_the_block(mesh):
    """Found on torchtitan's llama3 plan: the full capture gave this backward reduce-scatter to
    whichever child's backward ran last (w1 or w3), light capture to the block."""
    for light in (False, True):
        comm, _ = _record(lambda: torch.nn.Sequential(_GatherInsideForward(mesh)), _train(2, _sequence_sharded(mesh)), light=light)
        where = Counter((e.op, e.module, e.phase) for e in comm.trace.events)
        assert where == {("all_gather", "Sequential.0", "forward"): 2, ("reduce_scatter", "Sequential.0.w2", "forward"): 2,
                         ("reduce_scatter", "Sequential.0", "backward"): 2}, (light, where)


def _hooks(model: torch.nn.Module) -> tuple[int, int, int]:
    """Global forward pre-hooks, and the forward hooks and pre-hooks on the model's modules."""
    mods = list(model.modules())
    return (len(torch.nn.modules.module._global_forward_pre_hooks),
            sum(len(m._forward_hooks) for m in mods), sum(len(m._forward_pre_hooks) for m in mods))


def test_a_light_step_hooks_no_module_and_puts_module_call_back_after(mesh):
    """Light steps track modules by wrapping ``Module.__call__`` for their duration, not with
    hooks (a hook sends every module call down torch's slow path); backward collectives find
    their module by the autograd node that issues them. Checked from inside a module call."""
    model = _tp_mlp(mesh)
    seen = []
    model.append(_Probe(lambda: seen.append(_hooks(model))))
    original = torch.nn.Module.__call__
    without = _hooks(model)
    comm = CommDebugMode(light=True)
    with comm:
        for _ in range(2):
            model(torch.ones(4, 16, requires_grad=True)).sum().backward()
        wrapped = torch.nn.Module.__call__
    assert seen == [without, without]  # tensor parallelism's own hooks, none of ours
    assert wrapped is not original and torch.nn.Module.__call__ is original
    counts = {(e.module, e.phase) for e in comm.trace.events}
    # ColwiseParallel's input gradient is all-reduced in backward; RowwiseParallel's output in forward
    assert counts == {("Sequential.0", "backward"), ("Sequential.2", "forward")}


class _Probe(torch.nn.Module):
    def __init__(self, probe) -> None:
        super().__init__()
        self.probe = probe

    def forward(self, x):
        self.probe()
        return x


def _each_collective_once(monkeypatch, native: bool) -> tuple[Counter, Counter]:
    """The collectives of the two tests below, each recorded once: (kernel passes, recordings)
    by op, through the C++ kernel's handler or the Python kernels."""
    import torch.distributed._functional_collectives as funcol

    from commdebug.capture import light

    if not native:
        monkeypatch.setattr(light, "_native", None)
    elif light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    kernel_passes: Counter = Counter()
    recorded: Counter = Counter()
    make, through = light._kernel, light._through

    def counting(op, *args):
        kernel = make(op, *args)

        def counted(keys, *a, **k):
            kernel_passes[str(op)] += 1
            return kernel(keys, *a, **k)

        return counted

    def counted_through(redispatch, keys, name, *rest):
        recorded[name] += 1
        return through(redispatch, keys, name, *rest)

    handle = light._native_call

    def counted_handler(index, args, kwargs, call):
        kernel_passes[light._NATIVE_OPS[index][0]] += 1
        recorded[light._NATIVE_OPS[index][0]] += 1
        return handle(index, args, kwargs, call)

    monkeypatch.setattr(light, "_kernel", counting)
    monkeypatch.setattr(light, "_through", counted_through)
    monkeypatch.setattr(light, "_native_call", counted_handler)
    here_before = light._native.counts() if native else []
    with torch.inference_mode():
        with CommDebugMode(light=True) as started_inside:
            dist.all_reduce(torch.ones(2))
    with CommDebugMode(light=True) as comm:
        funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD).wait()
        # with gradients: torch's autograd kernel goes through its autograd.Function instead
        funcol.all_reduce(torch.ones(5, requires_grad=True), "sum", dist.group.WORLD).wait()
        dist.all_reduce(torch.ones(4))
        with torch.inference_mode():
            dist.all_reduce(torch.ones(3))
    assert [e.size_bytes for e in started_inside.trace.events] == [8]
    assert [(e.op, e.aten_op, e.size_bytes) for e in comm.trace.events] == [
        ("all_reduce", "_c10d_functional.all_reduce.default", 16),
        ("all_reduce", "_c10d_functional.all_reduce.default", 20),
        ("all_reduce", "c10d.allreduce_.default", 16),
        ("all_reduce", "c10d.allreduce_.default", 12),
    ]
    assert comm.in_flight() == []
    # only while a light recording is on: the op's own redispatch is back
    assert "redispatch" not in torch.ops._c10d_functional.all_reduce.default.__dict__
    if native:  # the C++ kernel recorded the rest itself (record_fast), without calling Python's handler
        for index, n in enumerate(light._native.counts()):
            here = n - (here_before[index] if index < len(here_before) else 0)
            if here:
                kernel_passes[light._NATIVE_OPS[index][0]] += here
                recorded[light._NATIVE_OPS[index][0]] += here
    return kernel_passes, recorded


def test_each_collective_passes_through_python_once(world, monkeypatch):
    """A functional collective already leaves C++ once, in the autograd kernel torch writes in
    Python: it is recorded there (``op.redispatch``) and passes no kernel of ours, nor does the
    c10d op its implementation issues through the dispatcher (eager c10d kernels sit at the
    autograd keys, which the functional op's dispatch has left). Eager c10d from Python, also
    under inference mode (entered inside or before the recording), passes one kernel: here the
    Python kernels, where the C++ one is not built."""
    kernel_passes, recorded = _each_collective_once(monkeypatch, native=False)
    assert kernel_passes == {"c10d.allreduce_.default": 3}
    assert recorded == {"_c10d_functional.all_reduce.default": 2, "c10d.allreduce_.default": 3}


def test_each_collective_calls_python_once_from_the_cpp_kernel(world, monkeypatch):
    """The same with the C++ kernel: each collective passes it once, recorded there or by its
    Python handler; the functional ones too (recording them in C++ costs less than in their
    Python autograd kernel's redispatch)."""
    kernel_passes, recorded = _each_collective_once(monkeypatch, native=True)
    assert kernel_passes == {"c10d.allreduce_.default": 3, "_c10d_functional.all_reduce.default": 2}
    assert recorded == {"_c10d_functional.all_reduce.default": 2, "c10d.allreduce_.default": 3}




def test_a_functional_collective_a_dispatch_mode_answers_itself_is_not_recorded(world):
    """A dispatch mode between autograd and our key takes the call first: the autograd kernel's
    redispatch leaves it alone, so a call the mode answers without running it (as fake-tensor
    and tracing modes do) is not recorded, and one it runs is recorded once, by our kernel."""
    import torch.distributed._functional_collectives as funcol
    from torch.utils._python_dispatch import TorchDispatchMode

    class Answers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops._c10d_functional.all_reduce.default:
                return args[0].clone()  # never issued
            return func(*args, **(kwargs or {}))

    class Forwards(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with CommDebugMode(light=True) as comm:
        with Answers():
            funcol.all_reduce(torch.ones(4, requires_grad=True), "sum", dist.group.WORLD).wait()
        with Forwards():
            funcol.all_reduce(torch.ones(2, requires_grad=True), "sum", dist.group.WORLD).wait()
    assert [(e.op, e.size_bytes) for e in comm.trace.events] == [("all_reduce", 8)]


def test_light_records_collectives_issued_under_inference_mode(world):
    """An evaluation loop under ``torch.inference_mode()`` that averages a metric over the ranks:
    eager c10d and functional collectives both. (Inference tensors skip the autograd and
    ADInplaceOrView keys: a kernel there would not see them.)"""
    import torch.distributed._functional_collectives as funcol

    def body(model, comm):
        with torch.inference_mode():
            loss = model(torch.ones(2, 8)).mean().reshape(1)
            dist.all_reduce(loss)
            funcol.all_reduce(loss, "sum", dist.group.WORLD).wait()

    full, light = _full_and_light(lambda: torch.nn.Linear(8, 1), body)
    _assert_same_collectives(full, light)


def _dtensors(mesh):
    a = distribute_tensor(torch.ones(16, 16), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(16, 16), mesh, [Shard(0)])
    return a, b


def test_light_records_the_redistribution_inside_a_dtensor_op(mesh):
    """``a @ b`` with both operands Shard(0): DTensor all-gathers ``b`` inside the mm itself
    (not in a module hook, not through an explicit redistribute). That collective is issued
    from below the mm's autograd kernel, where the autograd and ADInplaceOrView keys are
    excluded for everything called: a kernel there would not see it."""
    a, b = _dtensors(mesh)

    def body(model, comm):
        for i in range(2):
            if i:
                comm.step()
            _ = model(a) @ b

    full, light = _full_and_light(lambda: torch.nn.Identity(), body)
    assert [e.op for e in full] == ["all_gather", "all_gather"]
    _assert_same_collectives(full, light)


# ---- no dispatch mode in a light step -----------------------------------------------------------


@pytest.mark.parametrize("options, expected", [
    ({}, ["mode"] * 4),
    ({"light": True}, [None] * 4),
    ({"detail_every": 2}, ["mode", None, "mode", None]),
])
def test_no_dispatch_mode_is_active_in_a_light_step(world, options, expected):
    seen = []
    model = torch.nn.Linear(4, 4)
    model.register_forward_hook(lambda *_: seen.append(_get_current_dispatch_mode()))
    comm = CommDebugMode(**options)
    with comm:
        for i in range(4):
            if i:
                comm.step()
            model(torch.ones(1, 4))
            dist.all_reduce(torch.ones(1))
    assert ["mode" if m is comm else m for m in seen] == expected
    assert _get_current_dispatch_mode() is None  # nothing left on the stack after the context
    assert [e.step for e in comm.trace.events] == [0, 1, 2, 3]


# ---- detail_every ------------------------------------------------------------------------------


def test_detail_every_gives_dtensor_ops_on_every_nth_step_and_light_events_between(mesh):
    a, b = _dtensors(mesh)

    def body(model, comm):
        for i in range(6):
            if i:
                comm.step()
            _ = a @ b

    full, _ = _record(lambda: None, body)
    detail, _ = _record(lambda: None, body, detail_every=2)
    meta = detail.trace.metadata
    assert meta["capture"] == "light" and meta["detail_every"] == 2
    assert meta["detail_steps"] == [0, 2, 4]
    events = list(detail.trace.events)
    # detail steps: the DTensor op behind the all_gather, as under full capture
    assert {e.step for e in events if e.dtensor_op is not None} == {0, 2, 4}
    for e in events:
        if e.step % 2 == 0:
            assert (e.dtensor_op, e.placements) == ("aten.mm.default", "[(Shard(dim=0),), (Shard(dim=0),)]")
        else:
            assert e.dtensor_op is None and e.placements is None
    # light steps: the same collective all the same, without the op
    by_step = {s: [(e.op, e.size_bytes, e.group.name) for e in events if e.step == s] for s in range(6)}
    expected = {s: [(e.op, e.size_bytes, e.group.name) for e in full.trace.events if e.step == s] for s in range(6)}
    assert expected[0] == [("all_gather", 16 * 16 * 4, "0")]
    assert by_step == expected, (
        "detail_every=2 records different collectives from full capture, per step (op, size_bytes, group): "
        f"{ {s: by_step[s] for s in range(6) if by_step[s] != expected[s]} } instead of "
        f"{ {s: expected[s] for s in range(6) if by_step[s] != expected[s]} }"
    )
    assert [e.seq for e in events] == list(range(6))


@pytest.mark.parametrize("workload", ["tp_mlp", "eager_c10d_in_modules"])
def test_detail_every_records_the_same_collectives_as_full(workload, mesh):
    """Switching between detail and light steps loses and repeats nothing; steps 0 and 2 run
    under the dispatch mode, 1 under light capture."""
    make, body, _ = WORKLOADS[workload]
    full, _ = _record(lambda: make(mesh), body)
    detail, modes = _record(lambda: make(mesh), body, detail_every=2)
    assert detail.trace.metadata["detail_steps"] == [0, 2]
    assert {m is detail for m in modes} == {True, False} and set(modes) <= {detail, None}
    _assert_same_collectives(list(full.trace.events), list(detail.trace.events))
    assert {e.step for e in detail.trace.events} == {0, 1, 2}


# ---- pipelining on 2 gloo ranks ----------------------------------------------------------------

def _scheduled(events) -> Counter:
    """The schedule's send/recv (tagged with a microbatch), with microbatch and peer."""
    return Counter((_key(e), e.microbatch, e.peer) for e in events if e.microbatch is not None)


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_light_records_a_pipelining_schedule_and_ddp_like_full(tmp_path):
    spawn_ranks(gloo_worker.pipeline_full_and_light, 2, str(tmp_path))
    for rank in range(2):
        full = list(commdebug.load(tmp_path / f"full{rank}.json").events)
        trace = commdebug.load(tmp_path / f"light{rank}.json")
        assert trace.metadata["capture"] == "light"
        light = list(trace.events)
        _assert_same_collectives(full, light)
        assert _scheduled(full) == _scheduled(light), rank
        # per step: each microbatch's activation forward and its gradient back
        assert sum(_scheduled(light).values()) == 2 * 2 * gloo_worker.MICROBATCHES, rank
        assert {e.module for e in light if e.microbatch is not None} == {"Sequential"}
        # DDP in the same ranks: the reducer's bucket all-reduces, from C++, on the layer whose
        # gradient completed the bucket (light steps find it from the AccumulateGrad node)
        ddp_full = list(commdebug.load(tmp_path / f"ddp_full{rank}.json").events)
        ddp_light = list(commdebug.load(tmp_path / f"ddp_light{rank}.json").events)
        _assert_same_collectives(ddp_full, ddp_light)
        assert {e.module for e in ddp_light if e.phase == "backward"} > {"DistributedDataParallel.module.0"}


# ---- `commdebug run --light` under torchrun ----------------------------------------------------


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_commdebug_run_light_counts_every_all_reduce_on_each_rank(tmp_path):
    steps, params = 3, 4  # light_job.py: a metric all_reduce and one per gradient, every step
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIGHT_STEPS": str(steps)}
    env.pop("COMMDEBUG_LIGHT", None)  # the flag alone asks for light capture
    env.pop("COMMDEBUG_DETAIL_EVERY", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "commdebug", "run", "--out", "traces", "--light", "--", str(LIGHT_JOB)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the torchrun job did not finish within {DEADLINE_S}s: {(e.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        trace = commdebug.load(tmp_path / "traces" / f"rank{rank}.json")
        meta = trace.metadata
        assert (meta["rank"], meta["world_size"], meta["capture"]) == (rank, 2, "light")
        events = list(trace.events)
        all_reduces = [e for e in events if e.op == "all_reduce"]
        assert len(all_reduces) == steps * (1 + params), rank
        assert Counter(e.step for e in all_reduces) == {s: 1 + params for s in range(steps)}
        assert Counter(e.module for e in all_reduces) == {"Model.metric": steps, "Global": steps * params}
        assert [e.seq for e in events] == list(range(len(events)))  # one group, nothing skipped
        assert trace.totals()["collectives"] == steps * (1 + params) + 1  # and the final barrier


def test_light_records_a_collective_whose_tensors_come_by_keyword(world):
    """A direct op call with its output by keyword (``..._out(..., out=)``): recorded like the
    full capture records it, with the gathered output's bytes."""

    def body(model, comm):
        out = torch.zeros(4 * world)
        torch.ops._c10d_functional.all_gather_into_tensor_out(model(torch.ones(4)), world, "0", out=out)
        torch.ops._c10d_functional.wait_tensor(out)

    full, light = _full_and_light(lambda: torch.nn.Identity(), body)
    _assert_same_collectives(full, light)
    assert [(e.op, e.size_bytes) for e in light] == [("all_gather", 16 * world)]


def test_a_module_made_where_a_dead_one_was_gets_its_own_name(world):
    """Light steps know modules by id: a module made after another died (Python often reuses
    the memory, and so the id) must not inherit the dead one's name."""
    import torch.distributed._functional_collectives as funcol

    class Reduce(torch.nn.Module):
        def forward(self, x):
            return funcol.all_reduce(x, "sum", dist.group.WORLD).wait()

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Reduce()

        def forward(self, x):
            return self.inner(x)

    reused = 0
    x = torch.ones(4)
    with CommDebugMode(light=True) as comm:
        for _ in range(20):
            outer = Outer()
            outer(x)
            dead = {id(outer), id(outer.inner)}
            del outer
            fresh = Reduce()
            reused += id(fresh) in dead
            fresh(x)
            del fresh
    assert reused, "no id was reused: the test shows nothing on this interpreter"
    assert Counter(e.module for e in comm.trace.events) == {"Outer.inner": 20, "Reduce": 20}


def test_outside_a_light_recording_collectives_pass_no_kernel_of_ours(world):
    """The kernels exist only while a light recording is active, so the program before and
    after one runs as if commdebug were not imported; nested recordings keep them until the
    last one ends. A DTensor's wait (``AsyncCollectiveTensor.trigger_wait``) still finishes its
    collective: nothing is left in flight."""
    from commdebug.capture import light

    assert not light.installed()
    outer, inner = CommDebugMode(light=True), CommDebugMode(light=True)
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    with outer:
        assert light.installed()
        with inner:
            x = distribute_tensor(torch.ones(world, 4), mesh, [Shard(0)])
            y = (x @ x.T).full_tensor()  # Shard(0) @ Shard(0): all-gathers inside the op
        assert light.installed()
    assert not light.installed()
    assert y.shape == (world, world)
    # the innermost recording gets the collectives, and every one of them finished
    assert [e.op for e in inner.trace.events] == ["scatter", "all_gather", "all_gather"]
    assert inner.in_flight() == [] and not outer.trace.events


def test_node_ranges_find_the_innermost_call_also_after_the_oldest_were_dropped(monkeypatch):
    # Backward collectives of light steps are placed by the autograd numbers each module call
    # made, logged as the calls start and end; a forward with no step boundary drops the oldest
    # calls past a cap.
    from commdebug.capture import calls

    monkeypatch.setattr(calls, "_CAP", 4)
    numbers = iter(range(1000))
    ranges = calls.NodeRanges()

    def open_(path):
        ranges.log += (next(numbers), path)

    def close():
        ranges.log += (next(numbers), None)

    open_(("Global", "Model"))  # made nodes 0 onwards
    open_(("Global", "Model", "layer0"))  # starts at 1
    close()  # layer0 made node 1 (ends at 2)
    open_(("Global", "Model", "layer1"))  # starts at 3
    close()  # ends at 4
    assert ranges.find(1) == ("Global", "Model", "layer0")
    assert not ranges.log  # folded by the first lookup
    assert ranges.find(2) == ("Global", "Model")  # between the layers: the enclosing call
    assert ranges.find(3) == ("Global", "Model", "layer1")
    # more calls than the cap: the oldest half goes, the open outer call still encloses
    for i in range(2, 5):
        open_(("Global", "Model", f"layer{i}"))
        close()
    ranges.fold()
    assert len(ranges.starts) < 5 and ranges.find(1) == ("Global", "Model")  # layer0 forgotten
    last = ranges.starts[-1]
    assert ranges.find(last) == ("Global", "Model", "layer4")
    close()
    assert ranges.find(last + 1) == ("Global", "Model")  # made by the outer call after layer4
    ranges.clear()
    assert ranges.find(last) is None


@pytest.mark.parametrize("light", [True, False])
def test_forwards_with_no_backward_keep_the_module_call_log_bounded(world, monkeypatch, light):
    """Both captures log every module call made with gradients on, for backward collectives to
    find; forwards that never reach a backward or a step boundary must not grow it forever."""
    from commdebug.capture import calls

    monkeypatch.setattr(calls, "LOG_CAP", 16)
    monkeypatch.setattr(calls, "_CAP", 16)
    chain = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(5)])
    x = torch.ones(1, 2, requires_grad=True)
    with CommDebugMode(light=light) as comm:
        for _ in range(200):
            chain(x)  # six module calls, 24 log items, nothing that folds them
        ranges = comm._tracker._ranges
        # a call folds a log of 16 items before it logs; the calls still running add at most 24
        assert 0 < len(ranges.log) <= 16 + 24
        assert len(ranges.starts) <= 16

