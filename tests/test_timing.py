"""Timing, summaries, filters, the step window, verbose logging and configuration: a real
4-rank gloo run (tests/gloo_worker.py:timing), plus the parts that need no second process."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import commdebug
from commdebug import CommDebugMode
from commdebug.analysis.summary import summarize
from commdebug.capture.config import ConfigError
from commdebug.capture.timing import AsyncTimer, _report
from commdebug.render.summary import render_summary, size_bin_label
from commdebug.units import format_duration

import gloo_worker
from test_multiprocess import DEADLINE_S, spawn_ranks

WORLD = 4
ALL_KINDS = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter", "send", "recv", "barrier"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("timing")
    spawn_ranks(gloo_worker.timing, WORLD, str(out))
    return out


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_every_op_kind_is_timed_with_consistent_bandwidths(run):
    for rank in range(WORLD):
        trace = commdebug.load(run / f"timed{rank}.json")
        assert trace.metadata["timing"] == "sync"
        assert {e.op for e in trace.events} == ALL_KINDS
        # waiting on each send/recv could deadlock the ring: untimed, and the dump says why
        p2p = [e for e in trace.events if e.op in ("send", "recv")]
        assert len(p2p) == 2 and all(e.latency_s is None for e in p2p)
        assert any("does not time send/recv" in n for n in trace.metadata["timing_notes"])
        for e in trace.events:
            if e in p2p:
                continue
            assert e.latency_s is not None and e.latency_s > 0, e
            assert e.start_s is not None and 0 <= e.start_s <= trace.metadata["elapsed_s"]
            assert e.algbw_gbps == pytest.approx(e.size_bytes / e.latency_s / 1e9)
            assert e.busbw_gbps == pytest.approx(e.algbw_gbps * e.busbw_factor)
        starts = [e.start_s for e in trace.events if e.start_s is not None]
        assert starts == sorted(starts)  # calls start in the order they were made
        for row in summarize(trace, "op").rows:
            if row.key["op"] in ("send", "recv"):
                assert row.timed_calls == 0 and row.time_s is None
                continue
            events = [e for e in trace.events if e.op == row.key["op"]]
            time_s = sum(e.latency_s for e in events)
            assert row.calls == len(events) and row.time_s == pytest.approx(time_s)
            assert row.algbw_gbps == pytest.approx(sum(e.size_bytes for e in events) / time_s / 1e9)
            assert row.busbw_gbps == pytest.approx(sum(e.size_bytes * e.busbw_factor for e in events) / time_s / 1e9)
            assert row.busbw_p50_gbps <= row.busbw_p90_gbps <= row.busbw_p99_gbps


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_a_late_rank_shows_in_the_others_latency(run):
    for rank in range(WORLD):
        trace = commdebug.load(run / f"timed{rank}.json")
        waits = [e.latency_s for e in trace.events if e.op == "all_reduce" and e.size_bytes == 4096]
        assert len(waits) == 4
        if rank == gloo_worker.SLEEPY_RANK:
            assert waits[2] < gloo_worker.SLEEP_S / 2  # it arrived last: no one to wait for
        else:
            assert waits[2] >= gloo_worker.SLEEP_S * 0.75, (rank, waits)
            assert max(waits[3], waits[1]) < gloo_worker.SLEEP_S / 2, (rank, waits)


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_summary_of_the_dump_is_the_live_summary(run):
    for rank in range(WORLD):
        live = (run / f"summary{rank}.txt").read_text()
        offline = render_summary(summarize(commdebug.load(run / f"timed{rank}.json"), "op,size"))
        # elapsed time is measured at the live call and at exit, the rest is identical
        assert _without_elapsed(live) == _without_elapsed(offline)
        assert "communication" in live and "% of recorded time" in live


def _without_elapsed(text: str) -> list[str]:
    lines = text.splitlines()
    return [lines[0]] + lines[2:]


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_ops_filter_records_only_those(run):
    for rank in range(WORLD):
        trace = commdebug.load(run / f"ops{rank}.json")
        assert [e.op for e in trace.events] == ["all_reduce", "broadcast"]
        assert set(trace.totals()["by_op"]) == {"all_reduce", "broadcast"}


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_crossnode_only_keeps_what_leaves_the_node(run):
    for rank in range(WORLD):
        trace = commdebug.load(run / f"cross{rank}.json")
        got = [(e.op, e.group.ranks if e.op == "all_reduce" else e.peer) for e in trace.events]
        other = (0, 2) if rank % 2 == 0 else (1, 3)
        far = (rank + 2) % WORLD
        assert got == [("all_reduce", (0, 1, 2, 3)), ("all_reduce", other), ("send", far), ("recv", far)]


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 30)
def test_step_window_verbose_and_deepspeed_config(run):
    for rank in range(WORLD):
        trace = commdebug.load(run / f"window{rank}.json")
        # steps 1 and 2 only; only the DeepSpeed prof_ops; timed, since the logger is enabled
        assert sorted({e.step for e in trace.events}) == [1, 2]
        assert Counter(e.op for e in trace.events) == {"all_reduce": 4, "all_gather": 2}
        assert all(e.latency_s is not None and e.source for e in trace.events)
        assert trace.metadata["timing"] == "sync"
        lines = (run / f"verbose{rank}.log").read_text().splitlines()
        assert len(lines) == len(trace.events)
        for line, e in zip(lines, trace.events, strict=True):
            fields = dict(part.split("=", 1) for part in line.split(" | "))
            assert fields["rank"] == str(rank) and fields["op"] == e.op
            assert fields["group"] == "default_pg[4]" and fields["module"] == "Global"
            assert fields["time"] == format_duration(e.latency_s) and fields["algbw"].endswith(" GB/s") and fields["busbw"].endswith(" GB/s")
            assert fields["at"].startswith("gloo_worker.py:")


# ---- without a second process -----------------------------------------------------------------


def test_untimed_summary_says_so(world):
    comm = CommDebugMode()
    with comm:
        dist.all_reduce(torch.ones(8))
    text = comm.generate_summary_table()
    assert "no timing was recorded (timing off): counts and bytes only" in text
    assert "algbw" not in text and "all_reduce      1" in text.replace("  ", "  ")
    data = summarize(comm.trace, "op").to_dict()
    assert data["rows"] == [{"op": "all_reduce", "calls": 1, "bytes": 32, "timed_calls": 0, "time_s": None, "avg_time_s": None,
                             "latency_min_s": None, "latency_max_s": None, "algbw_gbps": None, "busbw_gbps": None, "busbw_p50_gbps": None, "busbw_p90_gbps": None, "busbw_p99_gbps": None, "unknown_size_calls": 0}]
    assert data["header"]["timing"] == "off" and data["header"]["comm_time_s"] is None


@pytest.mark.parametrize("by", ["op", "op,size", "op,bin", "module", "group", "step", "phase"])
def test_summary_groupings_cover_every_call(world, tp_transformer, by):
    model, tokens = tp_transformer()
    comm = CommDebugMode()
    with comm:
        for _ in range(2):
            model(tokens).sum().backward()
            comm.step()
    summary = summarize(comm.trace, by)
    assert sum(r.calls for r in summary.rows) == comm.get_total_counts()
    assert sum(r.bytes for r in summary.rows) == comm.trace.totals()["bytes"]
    assert len({tuple(r.key.values()) for r in summary.rows}) == len(summary.rows)


def test_size_bins_are_powers_of_two(world):
    comm = CommDebugMode()
    with comm:
        for n in (1, 3, 4, 700, 1024):
            dist.all_reduce(torch.ones(n))  # 4, 12, 16, 2800, 4096 bytes
        dist.barrier()
    rows = {(r.key["op"], r.key["size_bin"]): r.calls for r in summarize(comm.trace, "op,bin").rows}
    assert rows == {("all_reduce", (4, 8)): 1, ("all_reduce", (8, 16)): 1, ("all_reduce", (16, 32)): 1,
                    ("all_reduce", (2048, 4096)): 1, ("all_reduce", (4096, 8192)): 1, ("barrier", (0, 0)): 1}
    assert [size_bin_label(b) for b in ((4, 8), (2048, 4096), (0, 0))] == ["4 B - 8 B", "2.00 KiB - 4.00 KiB", "0 B"]


def test_unknown_summary_grouping_is_a_clear_error(world):
    with pytest.raises(commdebug.CommDebugError, match="unknown summary grouping 'size,op'"):
        CommDebugMode().generate_summary_table(by="size,op")


def test_async_timing_joins_reported_durations_by_group_and_sequence():
    """The NCCL path without a GPU: completion reports arrive in any order, and out of the
    context's events, only those (group, seq) matched get a time; nothing is made up."""
    timer = AsyncTimer(lambda key, message: None)
    with timer:
        pg_a = SimpleNamespace(_get_sequence_number_for_group=lambda: seq["a"])
        pg_b = SimpleNamespace(_get_sequence_number_for_group=lambda: seq["b"])
        seq = {"a": 7, "b": 3}
        timer.issued("a", pg_a, 0)
        seq["a"] = 8
        timer.issued("a", pg_a, 1)
        timer.issued("b", pg_b, 2)
        # the watchdog thread's reports, as ProcessGroupNCCL's WorkInfo carries them
        for group, s, dur in (("a", 8, 0.002), ("b", 3, 0.001), ("a", 99, 0.5)):
            info = SimpleNamespace(seq=s, time_started=timedelta(seconds=100.0), active_duration=timedelta(seconds=dur))
            _report(group)(info)
        got = {}
        assert timer.join(lambda index, started, seconds: got.__setitem__(index, (started, seconds))) == 2
    assert got == {1: (100.0, 0.002), 2: (100.0, 0.001)}
    assert timer.pending == {("a", 7): 0}  # never reported: stays untimed
    assert list(timer.done) == []


def test_async_timing_on_a_backend_that_cannot_says_so_once(world, caplog):
    comm = CommDebugMode(timing="async")
    with caplog.at_level(logging.WARNING, logger="commdebug"), comm:
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
    assert all(e.latency_s is None for e in comm.trace.events)
    notes = comm.trace.metadata["timing_notes"]
    assert len(notes) == 1 and "needs NCCL" in notes[0] and "fake" in notes[0]
    assert sum("needs NCCL" in r.message for r in caplog.records) == 1
    assert "note: timing='async' needs NCCL" in comm.generate_summary_table()


def test_async_timing_on_nccl_registers_no_completion_hook_unless_asked(monkeypatch):
    """On an H100 (torch 2.11, NCCL 2.28) NCCL's completion hook aborted the process's
    communicators after a synchronous collective: by default the timer neither enables NCCL's
    timing nor registers the hook, and says why; the environment variable opts in."""
    import commdebug.capture.timing as timing

    calls: list[str] = []

    class PG:  # a ProcessGroupNCCL's two timing methods
        def _enable_collectives_timing(self):
            calls.append("timing")

        def _register_on_completion_hook(self, hook):
            calls.append("hook")

    pg = PG()
    monkeypatch.setattr(timing, "_backend_name", lambda pg: "nccl")
    notes: list[tuple[str, str]] = []
    monkeypatch.delenv(timing.HOOK_ENV, raising=False)
    assert AsyncTimer(lambda key, message: notes.append((key, message))).watch("0", pg) is False
    assert calls == [] and len(notes) == 1 and "aborted" in notes[0][1] and timing.HOOK_ENV in notes[0][1]
    monkeypatch.setenv(timing.HOOK_ENV, "1")
    assert AsyncTimer(lambda key, message: notes.append((key, message))).watch("0", pg) is True
    assert calls == ["timing", "hook"]


def test_on_nccl_the_clock_stops_before_the_recorders_own_work(world, monkeypatch):
    """On an idle GPU a CUDA event's time is when the host recorded it: on an H100 the recorder's
    work between issuing and waiting read as communication (361 us for a call the program's own
    events timed at 134 us). Where the wait returns at once (NCCL), the end event is recorded
    before the recorder records the call; elsewhere after, so that a hang in the wait is in the
    dump. The fake backend stands in for NCCL here, a timer that logs for CUDA events."""
    import commdebug.capture.recorder as recorder
    import commdebug.capture.timing as timing

    log: list[tuple[str, int]] = []
    comm = CommDebugMode(timing="sync")

    class Timer(timing.SyncTimer):  # CUDA events as a log of when each was recorded
        def __init__(self, on_cuda: bool, early: bool = False) -> None:
            super().__init__(on_cuda=False, early=early)
            self.on_cuda = True

        def start(self):
            self.host_start = 0.0

        def stop(self, wait):
            wait()
            log.append(("end event", len(comm.trace.events)))

        def finish(self):
            log.append(("synchronize", len(comm.trace.events)))
            self.seconds = 1e-4
            return self.seconds

    monkeypatch.setattr(recorder, "SyncTimer", Timer)
    monkeypatch.setattr(recorder, "on_cuda", lambda args: True)
    for backend, expected in (("nccl", [("end event", 0), ("synchronize", 1)]), ("gloo", [("end event", 1), ("synchronize", 1)])):
        log.clear()
        monkeypatch.setattr(timing, "_backend_name", lambda pg, backend=backend: backend)
        with comm:  # a functional collective the program never waits for: only the mode did
            torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum", dist.group.WORLD.group_name)
            assert comm.in_flight() == [], backend  # not left in flight
        assert log == expected, backend
        assert comm.trace.events[0].latency_s == 1e-4
        assert comm.trace.metadata["timed_on"] == ["gpu"]  # its span bounds no host's clock in `trace`
    monkeypatch.setattr(timing, "_backend_name", lambda pg: "nccl")
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")  # NCCL's wait then blocks the host
    assert timing.waits_on_stream(None) is False
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "0")
    assert timing.waits_on_stream(None) is True


def test_on_cpu_a_calls_span_holds_its_end_however_long_the_recorder_took(world, monkeypatch):
    """On CPU, ``start_s + latency_s`` is on or after the moment the wait returned, and
    ``start_s`` before the call was issued, even where the recorder itself is slow on both sides
    of the issue (preempted, under load): ``commdebug trace`` bounds the hosts' clock offsets by
    these spans (no member ends a call before the last one began it), so a span that left out a
    stretch of the recorder's own work could end before another rank began the call."""
    import commdebug.capture.recorder as recorder

    comm = CommDebugMode(timing="sync")
    collective, record = recorder.Recorder._collective_with_options, recorder.Recorder._record_collective
    in_flight, wait = recorder.Recorder._in_flight, recorder.wait_until_finished
    issued_at: list[float] = []
    waited_at: list[float] = []

    def timed_collective(self, func, *args, **kwargs):
        def issue(*a, **k):
            issued_at.append(time.perf_counter() - self._t0)
            return func(*a, **k)
        return collective(self, issue, *args, **kwargs)

    def slow_record(self, *args, **kwargs):
        event = record(self, *args, **kwargs)
        time.sleep(0.02)  # preempted after recording the call, before issuing it
        return event

    def slow_in_flight(self, *args, **kwargs):
        time.sleep(0.02)  # preempted between issuing it and waiting for it
        return in_flight(self, *args, **kwargs)

    def timed_wait(*args, **kwargs):
        out = wait(*args, **kwargs)
        waited_at.append(time.perf_counter() - comm._t0)
        return out

    monkeypatch.setattr(recorder.Recorder, "_collective_with_options", timed_collective)
    monkeypatch.setattr(recorder.Recorder, "_record_collective", slow_record)
    monkeypatch.setattr(recorder.Recorder, "_in_flight", slow_in_flight)
    monkeypatch.setattr(recorder, "wait_until_finished", timed_wait)
    with comm:
        dist.all_reduce(torch.ones(4))
    (event,) = comm.trace.events
    assert event.start_s <= issued_at[0] and event.start_s + event.latency_s >= waited_at[-1], (event.start_s, event.latency_s, issued_at, waited_at)
    assert event.latency_s >= 0.02  # the stretch between issuing and waiting is in it
    assert comm.trace.metadata["timed_on"] == ["host"]  # so `trace` may bound clocks by it
    assert event.start_s >= issued_at[0] - 0.01  # the recording before the issue is not (it took 20 ms)


def test_a_recordings_wall_clock_origin_is_read_at_one_moment():
    """A process preempted between reading its two clocks would put every recorded time off on
    the wall clock by as long: the pair whose two wall-clock reads are close is kept."""
    from commdebug.capture import timekeeping

    walls = iter([100.0, 100.02, 200.0, 200.00001])  # preempted 20 ms in the first try
    perfs = iter([5.0, 7.0])
    assert timekeeping.clock_origin(wall=lambda: next(walls), perf_counter=lambda: next(perfs)) == (7.0, pytest.approx(200.000005))
    walls = iter([100.0, 100.02, 200.0, 200.01])  # never close: the closest pair
    perfs = iter([5.0, 7.0])
    assert timekeeping.clock_origin(tries=2, wall=lambda: next(walls), perf_counter=lambda: next(perfs)) == (7.0, pytest.approx(200.005))


def test_step_window_outside_runs_without_the_mode(world):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    comm = CommDebugMode(start_step=2, end_step=3)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with comm:
        for _ in range(4):
            seen.append(_get_current_dispatch_mode() is comm)
            model(torch.ones(1, 4)).sum().backward()
            dist.all_reduce(torch.ones(2))
            opt.step()
    assert seen == [False, False, True, False]
    assert [e.step for e in comm.trace.events] == [2]
    assert comm.trace.metadata["recorded_s"] < comm.trace.metadata["elapsed_s"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timing": "fast"}, "timing must be one of off, auto, events, sync, async"),
        ({"ops": ["all_reduse"]}, "ops: unknown collective 'all_reduse'"),
        ({"start_step": -1}, "start_step must be an integer >= 0"),
        ({"start_step": 5, "end_step": 5}, "end_step (5) must be greater than start_step (5)"),
        ({"max_events": "many"}, "max_events must be an integer >= 0 or null"),
    ],
)
def test_bad_options_name_the_key(kwargs, message):
    with pytest.raises(ConfigError) as info:
        CommDebugMode(**kwargs)
    assert message in str(info.value)


def test_crossnode_only_needs_ranks_per_node(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="crossnode_only needs ranks_per_node"):
        CommDebugMode(crossnode_only=True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun sets it
    assert CommDebugMode(crossnode_only=True).options.ranks_per_node == 8


def test_environment_variables_and_their_errors(monkeypatch):
    monkeypatch.setenv("COMMDEBUG_TIMING", "sync")
    monkeypatch.setenv("COMMDEBUG_OPS", "all_reduce,all_to_all_single")
    monkeypatch.setenv("COMMDEBUG_MAX_EVENTS", "none")
    options = CommDebugMode().options
    assert (options.timing, options.ops, options.max_events) == ("sync", frozenset({"all_reduce", "all_to_all"}), None)
    assert CommDebugMode(timing=False).options.timing == "off"  # arguments win
    monkeypatch.setenv("COMMDEBUG_VERBOSE", "loud")
    with pytest.raises(ConfigError, match=r"COMMDEBUG_VERBOSE: verbose must be true or false, got 'loud'"):
        CommDebugMode()
    monkeypatch.delenv("COMMDEBUG_VERBOSE")
    # read elsewhere, no options: the docs tell users to set them, so they are no typo
    monkeypatch.setenv("COMMDEBUG_RUN_ID", "job-7")
    monkeypatch.setenv("COMMDEBUG_NCCL_COMPLETION_HOOK", "1")
    assert CommDebugMode().options.timing == "sync"
    monkeypatch.setenv("COMMDEBUG_TIMNG", "sync")
    with pytest.raises(ConfigError, match="unknown environment variable COMMDEBUG_TIMNG"):
        CommDebugMode()


def test_config_files(tmp_path):
    ours = tmp_path / "commdebug.json"
    ours.write_text(json.dumps({"timing": "async", "start_step": 10, "end_step": 20, "nvtx": True}))
    o = CommDebugMode.from_config(ours).options
    assert (o.timing, o.start_step, o.end_step, o.nvtx) == ("async", 10, 20, True)
    assert CommDebugMode.from_config(ours, start_step=0).options.start_step == 0
    ds = {"comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False}}
    o = CommDebugMode.from_config(ds).options
    assert (o.enabled, o.timing, o.ops, o.record_source, o.verbose) == (True, "sync", None, False, False)
    disabled = CommDebugMode.from_config({"comms_logger": {"enabled": False}})
    with disabled:
        torch.ones(2) + 1
    assert disabled.get_total_counts() == 0 and disabled.trace.op_counts == {}
    bad = [
        ({"timing": "sync", "colour": True}, "unknown option 'colour'"),
        ({"comms_logger": {"enabled": True, "prof_opz": []}}, "comms_logger: unknown key 'prof_opz'"),
        ({"comms_logger": {"prof_all": False, "prof_ops": ["all_reduce", "allreduce"]}}, "comms_logger.prof_ops: unknown collective 'allreduce'"),
    ]
    for data, message in bad:
        with pytest.raises(ConfigError) as info:
            CommDebugMode.from_config(data)
        assert message in str(info.value)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match=r"broken.json: not valid JSON \(line 1, column 2"):
        CommDebugMode.from_config(tmp_path / "broken.json")
    with pytest.raises(ConfigError, match="missing.json: no such config file"):
        CommDebugMode.from_config(tmp_path / "missing.json")


def test_nvtx_without_cuda_is_a_one_time_notice(world, caplog):
    from commdebug.capture import stepping

    stepping._SAID.discard("nvtx")
    with caplog.at_level(logging.WARNING, logger="commdebug"):
        for _ in range(2):
            comm = CommDebugMode(nvtx=True)
            with comm:
                dist.all_reduce(torch.ones(2))
            assert comm.get_total_counts() == 1
    assert sum("nvtx=True has no effect without CUDA" in r.message for r in caplog.records) == 1


@pytest.mark.proc
def test_verbose_without_logging_configured_still_prints(world):
    import subprocess
    import sys

    script = (
        "import torch, torch.distributed as dist\n"
        "from commdebug.demo import init_fake_world\n"
        "from commdebug import CommDebugMode\n"
        "init_fake_world(4)\n"
        "with CommDebugMode(verbose=True):\n"
        "    dist.all_reduce(torch.ones(256))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("[commdebug] ")]
    assert line == "[commdebug] rank=0 | op=all_reduce | size=1.00 KiB | group=default_pg[4] | module=Global | at=<string>:6"
