"""timing="events" (docs/summary.md): each collective timed without waiting for it. On CUDA its
start and end events are read once done, at step boundaries, reads and exit; nothing on the
collective's path synchronises. Tested on the fake backend with a stand-in for CUDA's events (a
GPU clock the test moves), and on CPU, where it is the host clock from the call to its Work's
completion (a callback on the Work's future stamps it), or, for a functional collective, to the
program's own wait. What ``timing=True`` means: sync for the CPU calls the program waits for at
once (``async_op=False``), events for the rest."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from commdebug import CommDebugMode
from commdebug.analysis.summary import summarize, summarize_ranks
from commdebug.capture import light as light_capture, recorder as recorder_module, timing as timing_module
from commdebug.capture.config import Options
from commdebug.capture.timekeeping import AT_WAIT
from commdebug.render.summary import render_summary

_STAMPED = light_capture._native is not None  # CPU Works stamp their completion (the C++ extension)


class StandInEvent:
    def __init__(self) -> None:
        self.at: float | None = None  # GPU time the event was reached, once recorded
        self.after: object | None = None  # the Work a stream of ours waited for


class StandInCuda:
    """CudaEvents' methods over a GPU clock the test moves: an event recorded at GPU time t is
    done once the GPU has run up to t. Counts every wait, which only exit may do."""

    def __init__(self) -> None:
        self.gpu_now = 0.0  # where the GPU's queue is: each recorded event lands one step later
        self.ran_up_to = -1.0  # what the GPU has finished
        self.waits: list[float] = []
        self.created = 0

    def event(self) -> StandInEvent:
        self.created += 1
        return StandInEvent()

    def release(self, *events: StandInEvent) -> None:
        pass

    def record(self, event: StandInEvent) -> None:
        self.gpu_now += 1.0
        event.at = self.gpu_now

    def record_after(self, event: StandInEvent, work: object) -> None:
        self.record(event)
        event.after = work

    def done(self, event: StandInEvent) -> bool:
        assert event.at is not None
        return event.at <= self.ran_up_to

    def wait(self, event: StandInEvent) -> None:
        assert event.at is not None
        self.waits.append(event.at)
        self.ran_up_to = max(self.ran_up_to, event.at)

    def seconds(self, start: StandInEvent, end: StandInEvent) -> float:
        assert start.at is not None and end.at is not None
        return (end.at - start.at) / 1000  # a millisecond per GPU step


@pytest.fixture
def cuda(monkeypatch):
    """Collectives read as CUDA ones, timed by the stand-in; the mode's own wait is forbidden."""
    stand_in = StandInCuda()
    monkeypatch.setattr(timing_module, "CudaEvents", lambda: stand_in)
    monkeypatch.setattr(recorder_module, "on_cuda", lambda args: True)

    def no_wait(*args, **kwargs):
        raise AssertionError("timing='events' waited for a collective")

    monkeypatch.setattr(recorder_module, "wait_until_finished", no_wait)
    return stand_in


def test_cuda_events_are_read_when_done_and_never_synchronised_on_the_collectives_path(world, cuda):
    t = torch.ones(8)
    with CommDebugMode(timing="events") as comm:
        dist.all_reduce(t)  # GPU times 1-2: the program's own wait (inside torch.distributed) ends it
        work = dist.all_reduce(t, async_op=True)  # starts at 3
        funcol.all_reduce(t, "sum", dist.group.WORLD).wait()  # 4-5
        work.wait()  # the async all_reduce ends at 6, after what the program queued meanwhile
        dist.isend(torch.ones(2), dst=1)  # starts at 7, never waited for: its time is never known
        assert cuda.waits == []  # nothing synchronised while the collectives ran
        assert [e.latency_s for e in comm.trace.events] == [None] * 4  # nothing read yet
        cuda.ran_up_to = 2.0  # the GPU got through the first call
        comm.step()  # a step boundary reads what is done, and only that
        assert [e.latency_s for e in comm.trace.events] == [0.001, None, None, None]
        cuda.ran_up_to = 5.0  # and through the functional one
        comm.generate_summary_table()  # a read of the trace reads what is done since
        assert [e.latency_s for e in comm.trace.events] == [0.001, None, 0.001, None]
        assert cuda.waits == []
    assert cuda.waits == [6.0]  # at exit the last ones are waited for: the async all_reduce's end
    assert [e.latency_s for e in comm.trace.events] == [0.001, 0.003, 0.001, None]
    assert comm.trace.metadata["timing"] == "events"
    notes = comm.trace.metadata["timing_notes"]
    assert any("1 collective(s) have no latency: they never finished, the program never waited for them" in n for n in notes), notes


def test_an_nccl_work_gets_its_end_at_the_call_on_a_stream_that_waits_for_it(world, cuda, monkeypatch):
    # NCCL's Work: a stream of ours waits for it at the call, so the end is the collective's own,
    # whatever the program queues on its stream before it waits
    from commdebug.capture.groups import GroupResolver

    monkeypatch.setattr(GroupResolver, "waits_on_stream", lambda self, name: True)
    t = torch.ones(8)
    with CommDebugMode(timing="events") as comm:
        work = dist.all_reduce(t, async_op=True)  # GPU times 1-2, the end recorded at the call
        for _ in range(3):
            funcol.all_reduce(t, "sum", dist.group.WORLD).wait()  # the program's own work, 3-8
        work.wait()
    first = comm.trace.events[0]
    assert first.latency_s == pytest.approx(0.001)  # not the 7 steps until the program's wait
    assert cuda.waits == [2.0, 4.0, 6.0, 8.0]  # read at exit, each once


def test_events_on_cpu_time_a_work_to_its_completion_and_a_functional_call_to_the_programs_wait(world, monkeypatch):
    def no_wait(*args, **kwargs):
        raise AssertionError("timing='events' waited for a collective")

    monkeypatch.setattr(recorder_module, "wait_until_finished", no_wait)
    t = torch.ones(8)
    with CommDebugMode(timing="events") as comm:
        # a Work whose backend completes its future (the fake backend's, at once; gloo's when the
        # peers are done): timed to that completion, whoever waits for it, or if nobody does
        work = dist.all_reduce(t, async_op=True)
        time.sleep(0.05)  # the program's own work: not the collective's
        work.wait()
        dist.isend(torch.ones(2), dst=1)  # never waited for by the program
        # a functional collective has no Work to ask: timed from the call to the program's wait
        before = time.perf_counter()
        out = funcol.all_reduce(t, "sum", dist.group.WORLD)
        issued = time.perf_counter()
        torch.randn(200, 200) @ torch.randn(200, 200)
        waiting = time.perf_counter()
        assert comm.trace.events[2].latency_s is None  # not known before the program waits
        out.wait()
        after = time.perf_counter()
    latencies = [e.latency_s for e in comm.trace.events]
    # without the C++ extension a Work has no completion stamp: timed to the program's wait
    assert latencies[0] is not None and (latencies[0] < 0.05) == _STAMPED, latencies
    assert latencies[1] is not None and latencies[1] < 0.05, latencies
    assert latencies[2] is not None and waiting - issued <= latencies[2] <= after - before, latencies
    assert comm.trace.metadata["timing"] == "events"
    # the functional call's latency holds the program's matmul: said, in the dump and where its bandwidth is shown
    assert AT_WAIT in comm.trace.metadata["timing_notes"]
    assert f"note: {AT_WAIT}" in render_summary(summarize(comm.trace)).splitlines()


def test_a_cpu_work_is_timed_when_its_future_completes_read_later_without_a_wait():
    """The stamp comes from a callback on the Work's future, on the thread that completes it (the
    backend's), and is read at the next read; a Work that never completes has no time."""
    from torch._C._distributed_c10d import _create_work_from_future

    from commdebug.capture import light

    if light._native is None:
        pytest.skip("commdebug.capture._native is not built here")
    timer = timing_module.EventTimer()
    futures = [torch.futures.Future(), torch.futures.Future()]
    starts = []
    for index, future in enumerate(futures):
        starts.append(timer.start(on_cuda=False))
        completion = timing_module.completion_of(_create_work_from_future(future))
        assert completion is not None and timer.issued(index, starts[-1], done=False, completion=completion) is None
    time.sleep(0.02)
    read: dict[int, float] = {}
    assert timer.collect(read.__setitem__) == 0 and timer.waited(0) is None  # not completed yet
    completing = threading.Thread(target=futures[0].set_result, args=(None,))  # as a backend's thread does
    before = time.perf_counter()
    completing.start()
    completing.join()
    completed = time.perf_counter()
    time.sleep(0.03)  # read later: the time is the completion's, not the read's
    assert timer.collect(read.__setitem__) == 1
    assert before - starts[0] <= read[0] <= completed - starts[0], read
    timer.collect(read.__setitem__, final=True)
    assert list(read) == [0] and timer.unknown == 1 and timer.at_wait == 0


def test_a_folder_says_a_note_its_ranks_wrote_alike_holds_each_ranks_own_count(world):
    """Two ranks, each with 1 of its 2 calls never waited for: the job's summary must not read as
    if the job had 1 such call."""
    traces, unwaited = [], []
    for rank in (0, 1):
        with CommDebugMode(timing="events") as comm:
            funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()
            unwaited.append(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))  # not waited for while recorded
        comm.trace.metadata["rank"] = rank
        traces.append(comm.trace)
    for out in unwaited:
        out.wait()
    lines = render_summary(summarize_ranks(traces)).splitlines()
    untimed = [line for line in lines if "have no latency" in line]
    assert untimed and all(line.startswith("note: ranks 0-1, each: timing='events': 1 collective(s)") for line in untimed), lines
    assert f"note: ranks 0-1, each: {AT_WAIT}" in lines


def test_timing_true_waits_only_for_cpu_calls_the_program_waits_for_at_once(world, monkeypatch):
    monkeypatch.setenv("COMMDEBUG_TIMING", "1")
    assert Options.resolve({}).timing == "auto"
    monkeypatch.delenv("COMMDEBUG_TIMING")
    t = torch.ones(8)
    with CommDebugMode(timing=True) as comm:
        assert comm.trace.metadata["timing"] == "auto"  # nothing timed yet
        dist.all_reduce(t)
    assert comm.trace.metadata["timing"] == "sync"  # gloo-like CPU calls: waited for, as before
    assert comm.trace.events[0].latency_s is not None
    assert AT_WAIT not in comm.trace.metadata.get("timing_notes", [])  # each call timed alone

    # a call the program waits for later (async_op=True, a functional collective) is not waited
    # for at the call: a Work's time runs to its completion (the fake backend's, at once), a
    # functional collective's to the program's own wait
    waits: list[str] = []
    wait = timing_module.SyncTimer.wait
    monkeypatch.setattr(timing_module.SyncTimer, "wait", lambda timer, fn: (waits.append("sync"), wait(timer, fn))[1])
    with CommDebugMode(timing=True) as comm:
        work = dist.all_reduce(t, async_op=True)
        out = funcol.all_reduce(t, "sum", dist.group.WORLD)
        assert waits == []
        time.sleep(0.05)
        work.wait()
        out.wait()
        dist.all_reduce(t)  # blocking: waited for, as it waits anyway
        assert waits == ["sync"]
    latencies = [e.latency_s for e in comm.trace.events]
    assert (latencies[0] < 0.05) == _STAMPED and latencies[1] >= 0.05 and latencies[2] < 0.05, latencies
    assert comm.trace.metadata["timing"] == "auto" and AT_WAIT in comm.trace.metadata["timing_notes"]
    assert any("async_op=False" in note for note in comm.trace.metadata["timing_notes"])

    stand_in = StandInCuda()
    monkeypatch.setattr(timing_module, "CudaEvents", lambda: stand_in)
    monkeypatch.setattr(recorder_module, "on_cuda", lambda args: True)
    with CommDebugMode(timing=True) as comm:
        dist.all_reduce(t)
        assert stand_in.waits == []
    assert comm.trace.metadata["timing"] == "events" and stand_in.waits == [2.0]


def test_the_gpu_checks_comparison_pairs_events_with_kernels_and_applies_the_bounds(world, tmp_path):
    """bench/gpu/events_check.py, which check.sh runs where a GPU is at hand, on made-up inputs."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))
    try:
        import events_check
    finally:
        sys.path.pop(0)
    with CommDebugMode() as comm:
        dist.all_reduce(torch.ones(8))
    base = comm.trace.events[0]
    big, small = 64 << 20, 4096
    events = [base._replace(step=1, size_bytes=big, latency_s=0.01),  # not a profiled step
              base._replace(step=2, size_bytes=big, latency_s=0.0105, seq=4),  # 5% off its kernel
              base._replace(step=2, size_bytes=small, latency_s=0.5, seq=5),  # small: not compared
              base._replace(step=3, size_bytes=big, latency_s=0.013, seq=6, module="Sequential.0"),  # FSDP's, async
              base._replace(step=3, size_bytes=big, latency_s=0.012, seq=7)]  # 20% off
    profile = {"traceEvents": [{"cat": "kernel", "name": f"ncclDevKernel_AllReduce_{i}", "ts": 100.0 * i, "dur": 10_000.0}
                               for i in range(4)] + [{"cat": "kernel", "name": "gemm", "ts": 5.0, "dur": 1.0}]}
    kernels = events_check.nccl_kernels(profile)
    assert len(kernels) == 4
    lines = events_check.compare(events_check.pair(events, kernels))
    assert lines == ["all_reduce #4 step 2 64 MiB: events 10.500 ms, kernel 10.000 ms, ratio 1.050 (within 10%: ok)",
                     "all_reduce #7 step 3 64 MiB: events 12.000 ms, kernel 10.000 ms, ratio 1.200 (within 10%: FAIL)"]
    assert events_check.pair(events, kernels[:3]).endswith("3 NCCL kernels in the profile: not paired")
    for name, ms in (("bare", 100.0), ("events", 101.0), ("sync", 130.0)):
        (tmp_path / f"steps_{name}.json").write_text(json.dumps({"steps": [1.0, 1.0] + [ms / 1e3] * 5}))
    assert events_check.step_times(tmp_path) == ["step time bare: median 100.00 ms over 5 steps",
                                                 "step time --timing events: median 101.00 ms, 1.010x bare (within 2%: ok)",
                                                 "step time --timing sync: median 130.00 ms, 1.300x bare (waits for each collective)"]


def test_a_loop_of_calls_whose_works_complete_with_no_step_boundary_loses_no_time(world):
    """More calls than the timer keeps unread (EventTimer.MOST), the program waiting for none and
    marking no step: the completed ones are read before any is dropped."""
    if not _STAMPED:
        pytest.skip("commdebug.capture._native is not built here: such calls are timed at the program's wait")
    calls = timing_module.EventTimer.MOST + 1000
    t = torch.ones(4)
    with CommDebugMode(timing="events", light=True) as comm:
        for _ in range(calls):
            dist.all_reduce(t, async_op=True)  # the fake backend's Work is complete when it returns
    assert sum(e.latency_s is not None for e in comm.trace.events) == len(comm.trace.events) == calls
    assert not any("have no latency" in note for note in comm.trace.metadata.get("timing_notes", []))
