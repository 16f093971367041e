"""What the capture side tells the verdicts: which collectives finished, which failed, which FSDP2
unit an all-gather serves, which step a collective belongs to, which run a dump belongs to.
All on the fake process group (one process); real gloo runs are in test_real_jobs.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commdebug.capture.inflight as inflight_module
import commdebug.capture.recorder as recorder_module
from commdebug import CommDebugMode
from commdebug.capture.inflight import InFlight


class RecordedWork:
    """A c10d Work as gloo's reduce_scatter_tensor returns it (recorded on torch 2.13): it never
    reads completed, even after wait() returned, and has no future."""

    def is_completed(self) -> bool:
        return False


def _failed_gloo_work() -> dist.Work:
    """A real gloo all_reduce that failed: two ranks of one process (threads on a HashStore), and
    only rank 0 issues it, so gloo gives up after the groups' 1-second timeout. Its Work then
    reads completed, as one does whose peer closed the connection."""
    import datetime
    import threading
    import time

    store, groups = dist.HashStore(), {}

    def join(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=1))

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    work = groups[0].allreduce([torch.ones(4)])
    deadline = time.monotonic() + 60
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert work.is_completed()
    return work


@pytest.mark.parametrize("native", [True, False], ids=["extension", "without"])
def test_a_work_that_failed_stays_in_flight_though_it_reads_completed(monkeypatch, native):
    # a rank whose peer died: its all_reduce's Work fails and reads completed; a dump written
    # then (torchrun's SIGTERM comes before the program's wait raises) must not call the call
    # finished, which check would take as proof that the dead rank issued it
    if native and inflight_module._failed is inflight_module._failed_by_future:
        pytest.fail("the C++ extension is not built: python setup.py build_ext --inplace")
    if not native:
        monkeypatch.setattr(inflight_module, "_failed", inflight_module._failed_by_future)
    work = _failed_gloo_work()
    errors = []
    flight = InFlight(on_error=lambda index, text: errors.append((index, text)))
    flight.work_issued(0, "0", 0, inflight_module._work_key(work), work)
    assert [i for i, _ in flight.unfinished()] == [0]
    with pytest.raises(RuntimeError) as raised:
        work.wait()
    flight.work_waited(work, raised.value)  # what the wrapped Work.wait tells it
    assert flight.unfinished() == [] and [i for i, _ in errors] == [0]


def test_a_work_that_never_reads_completed_finishes_when_waited_or_overtaken(monkeypatch):
    errors = []
    flight = InFlight(on_error=lambda index, text: errors.append((index, text)))
    rs0, rs1, ar = RecordedWork(), RecordedWork(), RecordedWork()
    # the op's `out` holds a boxed Work; these stand-ins are their own Work
    monkeypatch.setattr(inflight_module, "work_of", lambda out: out if isinstance(out, RecordedWork) else None)
    for index, (work, seq) in enumerate(((rs0, 0), (rs1, 1), (ar, 2))):
        flight.issued(index, "0", seq, work, None)
    assert [i for i, _ in flight.unfinished()] == [0, 1, 2]
    flight.work_waited(rs1)  # wait() returned: finished, whatever is_completed says
    # and seq 0 on the same group finished before it: every member issued it
    assert [i for i, _ in flight.unfinished()] == [2]
    flight.work_waited(ar, RuntimeError("[gloo.cc:78] Connection closed by peer\nmore"))
    assert flight.unfinished() == []
    assert errors == [(2, "RuntimeError: [gloo.cc:78] Connection closed by peer")]


def test_a_wait_finishes_the_latest_collective_on_its_storage_in_the_order_things_happened():
    # A buffer freed and reused by the next collective's output must not finish the wrong one,
    # and a wait on a view finds its storage.
    errors = []
    flight = InFlight(on_error=lambda index, text: errors.append((index, text)))
    buf = torch.ones(4)
    flight.issued(0, "tp", 0, buf, None)
    flight.tensor_waited(buf)  # 0 finished, then its storage holds collective 1's output
    flight.issued(1, "dp", 0, buf, None)
    assert [i for i, _ in flight.unfinished()] == [1]
    flight.issued(2, "pp", 0, buf[1:], None)  # reused again before anyone waited for 1
    flight.tensor_waited(buf[2:])  # a wait on a view finds the storage: the latest, 2
    assert [i for i, _ in flight.unfinished()] == [1]
    flight.issued(3, "pp", 1, buf, None)
    flight.tensor_waited(buf, RuntimeError("Timed out waiting 600000ms for recv\nstack"))
    assert errors == [(3, "RuntimeError: Timed out waiting 600000ms for recv")]
    assert [i for i, _ in flight.unfinished()] == [1]


def test_a_functional_collective_is_unfinished_until_its_output_is_waited_for(world):
    comm = CommDebugMode()
    with comm:
        t = torch.ones(4)
        out = torch.ops._c10d_functional.all_reduce(t, "sum", "0")
        assert [e.op for e, _ in comm.in_flight()] == ["all_reduce"]
        torch.ops._c10d_functional.wait_tensor(out)
        assert comm.in_flight() == []


def test_eager_collectives_that_returned_are_not_in_flight(world):
    comm = CommDebugMode()
    with comm:
        dist.all_reduce(torch.ones(4))
        dist.reduce_scatter_tensor(torch.empty(1), torch.ones(8))
        work = dist.all_gather_into_tensor(torch.empty(16), torch.ones(2), async_op=True)
        work.wait()
        assert comm.in_flight() == []
    assert comm.mark_in_flight() == []


@pytest.mark.parametrize("light", [False, True])
@pytest.mark.parametrize("timing", [None, "sync"])
def test_a_call_the_backend_finished_before_returning_is_not_in_flight(world, monkeypatch, light, timing):
    """NCCL, called with async_op=False (torch.distributed's functions when not asked for
    async), synchronises inside the call and returns an empty Work: ``Work.unbox`` gives None
    (seen on an H100 with NCCL 2.28), and waiting on it crashes the process. Python never waits
    for it, so it must read finished, not hung, and timing='sync' must not wait on it. The
    empty Work is simulated here: the fake backend returns real ones."""
    from commdebug.capture import inflight

    monkeypatch.setattr(inflight, "_unbox", lambda item: None)
    with CommDebugMode(light=light, timing=timing) as comm:
        dist.all_reduce(torch.ones(4))
        dist.broadcast(torch.ones(2), src=0)
        assert comm.in_flight() == []
    assert [e.op for e in comm.trace.events] == ["all_reduce", "broadcast"]
    assert not any(e.in_flight for e in comm.trace.events)


def test_a_collective_whose_wait_raises_under_sync_timing_is_recorded_failed(world, monkeypatch):
    def broken_wait(out, spec, args, kwargs):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(recorder_module, "wait_until_finished", broken_wait)
    comm = CommDebugMode(timing="sync")
    with pytest.raises(RuntimeError, match="Connection closed"):
        with comm:
            dist.all_reduce(torch.ones(4))
    events = list(comm.trace.events)
    assert [(e.op, e.seq, e.error) for e in events] == [("all_reduce", 0, "RuntimeError: Connection closed by peer")]
    assert events[0].source.endswith("test_verdict_capture.py:" + str(_line_of("dist.all_reduce(torch.ones(4))\n    events")))
    # and the dump keeps it
    from commdebug.model.dump import from_dump_dict, to_dump_dict

    assert from_dump_dict(to_dump_dict(comm.trace)).events[0].error == "RuntimeError: Connection closed by peer"


def _line_of(snippet: str) -> int:
    text = open(__file__).read()
    return text[: text.index(snippet)].count("\n") + 1


def test_an_explicit_step_always_counts_also_outside_the_window(world):
    """start_step/end_step around eager collectives with explicit step() calls and no forward."""
    comm = CommDebugMode(start_step=1, end_step=3)
    with comm:
        for _ in range(4):
            dist.all_reduce(torch.ones(4))
            comm.step()
    assert sorted({e.step for e in comm.trace.events}) == [1, 2]
    assert comm.get_total_counts() == 2


def test_optimizer_step_then_explicit_step_still_count_one(world):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm = CommDebugMode()
    with comm:
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            dist.all_reduce(torch.ones(4))
            optimizer.step()
            comm.step()
    assert comm.trace.step == 3
    assert [e.step for e in comm.trace.events] == [0, 1, 2]


def test_fsdp2_all_gathers_name_the_unit_whose_parameters_they_carry(world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return x + self.fc(x)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Block() for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    mesh = init_device_mesh("cpu", (world,))
    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    comm = CommDebugMode()
    with comm:
        model(torch.randn(4, 16)).sum().backward()
    gathers = [(e.phase, e.module, e.unit) for e in comm.trace.events if e.op == "all_gather"]
    forward = [g for g in gathers if g[0] == "forward"]
    assert forward == [("forward", f"FSDPNet.layers.{i}", f"FSDPNet.layers.{i}") for i in range(3)]
    # backward prefetch: layers.i gathers layers.i-1 while its own backward runs
    backward = [g for g in gathers if g[0] == "backward"]
    assert ("backward", "FSDPNet.layers.2", "FSDPNet.layers.1") in backward
    assert ("backward", "FSDPNet.layers.1", "FSDPNet.layers.0") in backward
    scatters = {(e.module, e.unit) for e in comm.trace.events if e.op == "reduce_scatter"}
    assert {("FSDPNet.layers.0", "FSDPNet.layers.0"), ("FSDPNet.layers.2", "FSDPNet.layers.2")} <= scatters
    # the table names them at noise 1, and says nothing where a call serves its own module
    table = comm.generate_comm_debug_tracing_table(noise_level=1)
    assert "FSDP units of its own calls: FSDPNet.layers.0 x1" in table  # under layers.1
    assert "FSDP units of its own calls: FSDPNet.layers.2 x1, FSDPNet.layers.1 x1" in table
    assert "FSDP units" not in comm.generate_comm_debug_tracing_table(noise_level=0)


def test_the_run_id_comes_from_the_environment_on_the_fake_backend(world, monkeypatch):
    comm = CommDebugMode()
    with comm:
        dist.all_reduce(torch.ones(1))
    assert comm.trace.metadata["run_id"] is None  # one process pretending: nothing shared
    monkeypatch.setenv("COMMDEBUG_RUN_ID", "job-42")
    with comm:
        dist.all_reduce(torch.ones(1))
    assert comm.trace.metadata["run_id"] == "job-42"


def test_dtensor_collectives_waited_inside_other_ops_are_finished(world, tp_transformer):
    """AsyncCollectiveTensor waits from inside another op's dispatch, where the mode is off; and
    often on a view of the collective's output. Neither may leave a collective 'in flight'."""
    from torch.distributed.fsdp import fully_shard

    model, tokens = tp_transformer()
    comm = CommDebugMode()
    with comm:
        model(tokens).sum().backward()
        assert comm.get_total_counts() > 0
        assert comm.in_flight() == []
    # FSDP2 + clip_grad_norm_: the norm's all_reduce is waited for when the clip uses it
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for layer in net:
        fully_shard(layer)
    fully_shard(net)
    with comm:
        net(torch.randn(2, 8)).sum().backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        assert [e.op for e in comm.trace.events][-1] == "all_reduce"
        assert comm.in_flight() == []


def test_the_dump_says_how_the_recording_ended(world):
    comm = CommDebugMode()
    with comm:
        dist.all_reduce(torch.ones(1))
    assert comm.trace.metadata["ended_by"] == "context exit"
    with pytest.raises(ValueError):
        with comm:
            dist.all_reduce(torch.ones(1))
            raise ValueError("bad batch")
    assert comm.trace.metadata["ended_by"] == "ValueError: bad batch"


def test_calls_nobody_waits_for_cost_no_scan_per_collective_and_stay_bounded(monkeypatch):
    scans = []
    original = InFlight._forget_finished
    monkeypatch.setattr(InFlight, "_forget_finished", lambda self: (scans.append(len(self._entries())), original(self))[1])
    flight = InFlight(on_error=lambda index, text: None)
    for index in range(6000):  # functional outputs never waited for (results dropped)
        flight.issued(index, "0", None, torch.empty(1), None)
    assert len(scans) <= 6  # 257, 515, 1031, 2063, 4127: doubling, not one per call
    assert len(flight.unfinished()) == 4096  # the oldest let go beyond the bound
