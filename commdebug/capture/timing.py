"""How long each collective took: three ways to measure it.

- :class:`EventTimer` (``timing="events"``, and what ``timing=True`` means for CUDA
  collectives) never waits. On CUDA a start event is recorded on the current stream before the
  call and an end event where the collective is known to be done on a stream (below); both are
  read when they are done, with ``query()``, at step boundaries, on reads of the trace and at
  exit, where the last ones are waited for. Nothing on the collective's path synchronises, so
  the CPU runs ahead of the GPU as it does without commdebug. On CPU it is the host clock from
  the call to the moment the backend completed its Work (:func:`completion_of`: a callback on
  the Work's future, gloo's included, stamps it), read later; a call with no such future
  (functional collectives, or without the C++ extension) runs to the end of the program's own
  wait. A time never read (the process died first, the call never finished, or the program
  never waited for a call timed at its wait) stays unknown.
- :class:`SyncTimer` waits for the collective and times it: CUDA events on CUDA tensors (the
  start event is recorded on the current stream before the collective, the end event after
  waiting for it, so queued compute before the call is not counted), the host clock on CPU:
  from just before the call to the wait's return, all of it, so that the call's span on its
  rank's clock holds the moment it finished (``commdebug trace`` puts hosts on one clock by
  that: no member ends a call before the last one began it).
  Waiting serialises communication with compute, as DeepSpeed's comms logger does.
  On an idle GPU an event's time is when the host recorded it, so the end event must be
  recorded before the recorder's own work, not after: on an H100 the recorder's work read as
  communication (a one-rank 64 MiB all_reduce took 134 us by the program's own CUDA events and
  361 us by commdebug's). Where the wait only makes the current stream wait
  (:func:`waits_on_stream`: NCCL without blocking wait), the recorder stops the clock right after
  issuing and records its event after; where the wait blocks the host, the event is recorded
  first, so that a collective that hangs in the wait is in the dump.
- :class:`AsyncTimer` does not wait. ProcessGroupNCCL times its own kernels with CUDA events
  once ``_enable_collectives_timing()`` is called and reports each finished work, with its
  sequence number, to a completion hook on its watchdog thread. The timer remembers, for each
  event, the group's sequence number right after the collective was issued, and joins the
  reported durations to events by (group, sequence number) when asked (step boundaries, exit).
  Backends that cannot do this (gloo, fake) are said once and get no time, never a made-up one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import torch

from commdebug.capture.config import NCCL_HOOK_ENV

_native: ModuleType | None
try:
    from commdebug.capture import _native
except ImportError:  # not built: CPU calls are timed to the program's wait
    _native = None

__all__ = ["SyncTimer", "AsyncTimer", "EventTimer", "CudaEvents", "WorkDone", "completion_of", "nvtx_label", "on_cuda", "waits_on_stream"]

log = logging.getLogger("commdebug")


def on_cuda(args: tuple) -> bool:
    """Whether a collective's arguments hold a CUDA tensor (then CUDA events time it)."""
    from commdebug.capture.inflight import tensors

    return torch.cuda.is_available() and any(t.is_cuda for t in tensors(args))


def nvtx_label(op: str, input_bytes: int, group: Any, module: str) -> str:
    """The NVTX range name Nsight shows for one collective: ``all_gather 2.00 MiB mesh_dp[8] layers.3``."""
    from commdebug.units import format_bytes

    return f"{op} {format_bytes(input_bytes)} {group.label} {module}"


class SyncTimer:
    """Times one collective by waiting for it (the event is recorded before the wait, so that a
    collective that hangs or raises in the wait is in the dump). On CUDA the events leave out
    what the recorder does between issuing and waiting; with ``early`` (where the wait returns
    at once), :meth:`stop_early` stops the clock before the recorder's work. On CPU the clock
    runs from :meth:`start` to the wait's return, whatever ran in between: a time that left out
    a stretch could end before the call did (the recorder preempted between issuing and
    waiting), and then before another rank began it.

    >>> timer = SyncTimer(on_cuda=False)
    >>> timer.start(); out = issue(); record(out); timer.wait(lambda: wait(out))  # doctest: +SKIP
    >>> timer.seconds                                                                             # doctest: +SKIP
    """

    __slots__ = ("on_cuda", "early", "host_start", "seconds", "_stopped", "_start", "_end")

    def __init__(self, on_cuda: bool, early: bool = False) -> None:
        self.on_cuda, self.early = on_cuda, early
        self.seconds: float | None = None
        self._stopped = False
        if on_cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        """Just before the collective is issued."""
        self.host_start = time.perf_counter()
        if self.on_cuda:
            self._start.record()  # on the current stream: queued compute before it is not counted

    def stop_early(self, wait: Callable[[], None]) -> None:
        """Right after the call returned: if ``early``, wait with ``wait()`` and stop the clock now."""
        if self.early:
            self.stop(wait)
            self._stopped = True

    def wait(self, wait: Callable[[], None]) -> float:
        """Wait for the collective with ``wait()`` (unless :meth:`stop_early` did); return (and
        keep) its latency in seconds."""
        if not self._stopped:
            self.stop(wait)
        return self.finish()

    def stop(self, wait: Callable[[], None]) -> None:
        """Wait for the collective with ``wait()`` and stop the clock (on CUDA: record the end
        event on the current stream, which ``wait()`` made wait for the collective)."""
        wait()
        if self.on_cuda:
            self._end.record()
        else:
            self.seconds = time.perf_counter() - self.host_start

    def finish(self) -> float:
        """After :meth:`stop`: the latency in seconds (on CUDA, once the end event has happened)."""
        if self.on_cuda:
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        assert self.seconds is not None
        return self.seconds


def completion_of(work: Any) -> Any:
    """A stamp of when a CPU collective's Work completes (``done_at()``: its
    ``time.perf_counter()``, None before then or if it failed), taken by a C++ callback on the
    Work's future on the thread that completes it, with no GIL and no wait; None where the
    backend's Work has no future or the C++ extension is not built (then the call is timed to
    the program's own wait).

    >>> done = completion_of(dist.all_reduce(t, async_op=True))   # doctest: +SKIP
    >>> done.done_at()                                              # doctest: +SKIP
    """
    return _native.on_completion(work) if _native is not None else None


class CudaEvents:
    """What :class:`EventTimer` asks of CUDA; a stand-in with the same methods times the
    bookkeeping on a machine without a GPU (tests/test_timing.py). Events are reused once read:
    creating a CUDA event per collective costs a driver call each time."""

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._sides: dict[int, Any] = {}  # device index -> the stream end events wait on

    def event(self) -> Any:
        """A timing event, not recorded yet."""
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    def release(self, *events: Any) -> None:
        """Events read and no longer needed."""
        if len(self._free) < 1024:
            self._free.extend(events)

    def record(self, event: Any) -> None:
        """Record ``event`` on the current stream."""
        event.record()

    def record_after(self, event: Any, work: Any) -> None:
        """Record ``event`` on a stream of ours made to wait for ``work`` (an NCCL Work: the wait
        is a stream wait on its end, the host goes on at once): the event is done when the
        collective is, whatever the program queues on its own streams meanwhile."""
        device = torch.cuda.current_device()
        side = self._sides.get(device)
        if side is None:
            side = self._sides[device] = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            work.block_current_stream()
            event.record()

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def wait(self, event: Any) -> None:
        """Block until ``event`` is done: only at exit, never on a collective's path."""
        event.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3


class EventTimer:
    """``timing="events"``: each collective's time without waiting for it (see the module
    docstring). The recorder calls :meth:`start` before the call, :meth:`issued` after it,
    :meth:`waited` when the program's own wait for it returned, and :meth:`collect` where it
    reads the times (step boundaries, reads of the trace, and at exit with ``final``).

    Where the end event goes on CUDA: right after the call when the call returned with the
    collective done on the current stream (NCCL with ``async_op=False``, which makes the
    stream wait inside the call; the fused symmetric-memory ops); right after the call, on a
    stream of ours that waits for the Work, for an NCCL Work the program will wait for later
    (``async_op=True``); otherwise (functional collectives, other backends) when the program's
    wait returns, on the current stream, which its wait made wait for the collective: that end
    also waits for what the program queued on the stream between the call and its wait.

    On CPU, a call whose Work stamps its completion (``completion``, :func:`completion_of`) is
    timed from the call to that stamp, read at the program's wait or at the next collect: the
    collective alone, whoever waits for it (DDP waits for its buckets in C++). Other calls run to
    the program's own wait.

    >>> timer = EventTimer()
    >>> stamp = timer.start(on_cuda=False); out = issue()            # doctest: +SKIP
    >>> timer.issued(index, stamp, done=False); ...; timer.waited(index)   # the latency, on CPU  # doctest: +SKIP
    """

    MOST = 4096  # pairs kept unread (a program that never waits): the oldest are dropped, unknown

    def __init__(self, cuda: Any = None) -> None:
        self.cuda = cuda if cuda is not None else CudaEvents()
        # index -> [start, end (None until recorded)] on CUDA; index -> host start on CPU
        self.pending: dict[int, list[Any]] = {}
        self.host: dict[int, float] = {}
        self.completing: dict[int, tuple[float, Any]] = {}  # index -> (host start, its Work's completion stamp), on CPU
        self.unknown = 0  # never read: the program never waited, or the pair was dropped
        self.at_wait = 0  # ends taken where the program's own wait returned (see waited)

    def start(self, on_cuda: bool) -> Any:
        """Just before the collective is issued: its start (a recorded event, or the host clock)."""
        if not on_cuda:
            return time.perf_counter()
        event = self.cuda.event()
        self.cuda.record(event)
        return event

    def issued(self, index: int, stamp: Any, done: bool, work: Any = None, completion: Any = None) -> float | None:
        """Just after the call returned. ``done``: it returned with the collective done (on
        CUDA: the current stream waits for it); ``work``: an NCCL Work to record the end after;
        ``completion``: on CPU, the stamp its Work's completion will leave (:func:`completion_of`).
        Returns the latency where it is known now (CPU, done)."""
        if not isinstance(stamp, float):  # CUDA
            end = None
            if done or work is not None:
                end = self.cuda.event()
                if done:
                    self.cuda.record(end)
                else:
                    self.cuda.record_after(end, work)
            self._keep(self.pending, index, [stamp, end])
            return None
        if done:
            return time.perf_counter() - stamp
        if completion is not None:
            self._keep(self.completing, index, (stamp, completion))
        else:
            self._keep(self.host, index, stamp)
        return None

    def waited(self, index: int) -> float | None:
        """The program's own wait for collective ``index`` returned: on CPU its latency, now;
        on CUDA the end event goes on the current stream (unless it is there already)."""
        completing = self.completing.get(index)
        if completing is not None:
            # done by now, but its callback may run a moment after the wait returns: then the
            # next collect reads it
            at = completing[1].done_at()
            if at is None:
                return None
            del self.completing[index]
            return at - completing[0]
        start = self.host.pop(index, None)
        if start is not None:
            self.at_wait += 1
            return time.perf_counter() - start
        pair = self.pending.get(index)
        if pair is not None and pair[1] is None:
            end = self.cuda.event()
            self.cuda.record(end)
            pair[1] = end
            self.at_wait += 1
        return None

    def collect(self, apply: Callable[[int, float], None], final: bool = False) -> int:
        """Give each pair whose end is done its latency: ``apply(index, seconds)``. ``final``
        (at exit): wait for the ends recorded, and count the pairs without one as unknown."""
        read = 0
        cuda = self.cuda
        for index, (start, end) in list(self.pending.items()):
            if end is None:
                if final:
                    del self.pending[index]
                    cuda.release(start)
                    self.unknown += 1
                continue
            if final:
                cuda.wait(end)
            elif not cuda.done(end):
                continue  # later pairs may be done already (other streams): look at all
            del self.pending[index]
            apply(index, cuda.seconds(start, end))
            cuda.release(start, end)
            read += 1
        for index, (start_s, completion) in list(self.completing.items()):
            at = completion.done_at()
            if at is not None:
                del self.completing[index]
                apply(index, at - start_s)
                read += 1
        if final:  # what is still running is not waited for: a hung call would hang the exit
            self.unknown += len(self.host) + len(self.completing)
            self.host.clear()
            self.completing.clear()
        return read

    def _keep(self, table: dict[int, Any], index: int, value: Any) -> None:
        table[index] = value
        if len(table) > self.MOST:
            oldest = table.pop(next(iter(table)))  # insertion order
            if isinstance(oldest, list):
                self.cuda.release(*(e for e in oldest if e is not None))
            self.unknown += 1


def waits_on_stream(pg: Any) -> bool:
    """Whether ``Work.wait()`` on group ``pg`` returns at once, having made the current CUDA
    stream wait for the collective: NCCL's does, unless ``TORCH_NCCL_BLOCKING_WAIT`` is set."""
    if _backend_name(pg) != "nccl":
        return False
    blocking = os.environ.get("TORCH_NCCL_BLOCKING_WAIT", os.environ.get("NCCL_BLOCKING_WAIT", "0"))
    return blocking.strip().lower() not in ("1", "true", "yes", "y", "on")


class WorkDone(NamedTuple):
    """What a completion hook reports about one finished collective (NCCL's WorkInfo)."""

    group: str
    seq: int
    started_at: float | None  # epoch seconds when the collective was called
    duration_s: float | None  # GPU time between launch and completion


# ProcessGroupNCCL accepts one completion hook per group, for its lifetime: ours is registered
# once per group and hands each report to whichever timers are active.
_active: weakref.WeakSet[AsyncTimer] = weakref.WeakSet()
_hooked: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "total_seconds"):
        return value.total_seconds()
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return float(value)


# NCCL's completion hook, on an H100 with torch 2.11 and NCCL 2.28: once registered, a later
# collective called with async_op=False (torch.distributed's default) made the hook thread fail
# ("getDuration only works if timing was enabled") and abort every communicator of the process,
# and no duration reached the hook before the recording ended. It is used only when asked for.
HOOK_ENV = NCCL_HOOK_ENV
HOOK_UNSAFE = (
    "timing='async' records no latency on NCCL by default: NCCL's completion hook, which reports its own "
    "timings, aborted the process's communicators after a synchronous collective (torch 2.11, NCCL 2.28). "
    f"Use timing='sync', or set {HOOK_ENV}=1 to use the hook anyway"
)


class AsyncTimer:
    """Joins NCCL's own collective timings to events without synchronising."""

    def __init__(self, note: Callable[[str, str], None]) -> None:
        self.done: deque[WorkDone] = deque()  # appended on the watchdog thread
        self.pending: dict[tuple[str, int], int] = {}  # (group, seq) -> event index
        self._note = note  # (key, message): said once by the mode
        self._watched: dict[str, bool] = {}

    def __enter__(self) -> AsyncTimer:
        _active.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _active.discard(self)

    def watch(self, group: str, pg: Any) -> bool:
        """Switch NCCL timing on for a group the first time it is seen; False (said once per
        backend) where the backend cannot report durations."""
        ok = self._watched.get(group)
        if ok is None:
            ok = self._watched[group] = self._start(group, pg)
        return ok

    def _start(self, group: str, pg: Any) -> bool:
        backend = _backend_name(pg)
        if backend != "nccl":
            self._note(f"async:{backend}", f"timing='async' needs NCCL, which times its own kernels; the {backend or 'unknown'} backend cannot, so no latency is recorded for its collectives (use timing='sync')")
            return False
        if os.environ.get(HOOK_ENV) != "1":
            self._note("async:hook", HOOK_UNSAFE)
            return False
        try:
            pg._enable_collectives_timing()
            with _lock:
                if pg not in _hooked:
                    pg._register_on_completion_hook(_report(group))
                    _hooked.add(pg)
        except Exception as e:  # another tool's hook already there, or an older torch
            self._note(f"async:hook:{group}", f"cannot read NCCL's timings for group {group} ({e}); no latency recorded for it")
            return False
        return True

    def issued(self, group: str, pg: Any, index: int) -> None:
        """Remember the sequence number of the collective just issued on ``pg``."""
        try:
            seq = int(pg._get_sequence_number_for_group())
        except Exception:
            return
        self.pending[(group, seq)] = index

    def close(self, apply: Callable[[int, float | None, float | None], None]) -> list[int]:
        """At the recording's end: :meth:`join` once more, stop taking reports, and return the
        indexes of the events never timed, in order."""
        self.join(apply)
        self.__exit__()
        untimed = sorted(self.pending.values())
        self.pending.clear()
        return untimed

    def join(self, apply: Callable[[int, float | None, float | None], None]) -> int:
        """Give every reported duration to its event: ``apply(index, started_at, seconds)``."""
        joined = 0
        while self.done:
            work = self.done.popleft()
            index = self.pending.pop((work.group, work.seq), None)
            if index is not None:
                apply(index, work.started_at, work.duration_s)
                joined += 1
        return joined


def _report(group: str) -> Callable[[Any], None]:
    def on_completion(info: Any) -> None:
        done = WorkDone(group, int(info.seq), _seconds(getattr(info, "time_started", None)), _seconds(getattr(info, "active_duration", None)))
        for timer in list(_active):
            timer.done.append(done)

    return on_completion


def _backend_name(pg: Any) -> str:
    try:
        import torch.distributed as dist

        return str(dist.get_backend(pg)).lower()
    except Exception:
        return ""
