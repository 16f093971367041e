"""The recorder's timing: which way each collective is timed (``timing=`` and what ``True``
means), and how the times reach its events. A part of
:class:`~commdebug.capture.recorder.Recorder`, kept apart as :mod:`commdebug.capture.stepping`
is; the timers themselves are in :mod:`commdebug.capture.timing`.

``timing=True`` (``"auto"``) times CUDA collectives with events, never waiting for them, and
CPU ones by waiting only where the program waits at once anyway (a blocking c10d call,
``async_op=False``); a CPU call the program may wait for later (``async_op=True``, functional
collectives, send/recv) is timed by events too. Waiting for such a call would change the
program: its communication would no longer overlap its compute, and a rank that issues a call
its peers never match, then fails, would hang in commdebug's wait instead. ``metadata.timing``
says which way the run's were timed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from commdebug.capture.inflight import SYNCED, work_of
from commdebug.capture.timing import AsyncTimer, EventTimer, completion_of

if TYPE_CHECKING:
    from commdebug import ops as _ops
    from commdebug.capture.config import Options
    from commdebug.capture.groups import GroupResolver
    from commdebug.model.trace import CollectiveEvent, GroupInfo, Trace

__all__ = ["AT_WAIT", "Timekeeping", "clock_origin", "waited_at_once"]

log = logging.getLogger("commdebug")

# said once a run has a latency taken this way (dumps keep it in metadata.timing_notes)
AT_WAIT = ("timing events: calls whose end is not known when they return (functional collectives; on CPU, a Work whose backend "
           "does not say when it completed) are timed from the call to the program's own wait for them: what the program did in between is in their "
           "latency, so their algbw and busbw are lower bounds (timing='sync' times each call alone; a profiled step, "
           "--profile-steps, gives the kernels' own time)")


def clock_origin(tries: int = 5, within_s: float = 5e-5, wall: Callable[[], float] = time.time,
                 perf_counter: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(``perf_counter()``, ``time()``) read at one moment: the origin of a recording's
    ``start_s`` and its ``start_wall_s``. A process preempted between the two reads would put
    every time it records that much off on the wall clock (a rank whose calls then seem to end
    before others began them, in ``commdebug trace``), so the wall clock is read on both sides
    and the pair kept whose sides are within ``within_s``, at their middle (the closest of
    ``tries`` otherwise)."""
    best: tuple[float, float, float] | None = None
    for _ in range(tries):
        before = wall()
        perf = perf_counter()
        after = wall()
        if best is None or after - before < best[0]:
            best = (after - before, perf, (before + after) / 2)
        if after - before <= within_s:
            break
    assert best is not None
    return best[1], best[2]


def waited_at_once(spec: _ops.CollectiveSpec, args: tuple, kwargs: dict) -> bool:
    """Whether the program waits for this call as soon as it returns: an eager c10d op called
    with ``async_op=False`` (``dist.all_reduce(t)``, whose wrapper waits for the Work at once).
    Calls made with ``async_op=True``, functional collectives and send/recv return to a program
    that may wait for them later, or never.

    >>> waited_at_once(lookup(torch.ops.c10d.allreduce_), (tensors, pg, op, None, False), {})   # doctest: +SKIP
    True
    """
    flag = spec.async_flag
    if flag is None:
        return False
    return (args[flag] if flag < len(args) else kwargs.get("async_op", True)) is False


class Timekeeping:
    """Timing state and its glue, for the Recorder (whose ``trace``, ``options``, ``_groups``
    and ``_listeners`` it reads)."""

    if TYPE_CHECKING:  # the Recorder's state
        options: Options
        trace: Trace
        _groups: GroupResolver
        _listeners: list[Callable[[CollectiveEvent], None]]
        _t0_wall: float

        def _emit(self, event: CollectiveEvent) -> None: ...

    def _reset_timing(self) -> None:
        timing = self.options.timing
        self._async = AsyncTimer(self._note) if timing == "async" else None
        self._events = EventTimer() if timing in ("events", "auto") else None
        self._timing_used: set[str] = set()
        self._timed_on: set[str] = set()  # "host", "gpu": whose clock the timed calls were timed on

    def _timing_for(self, cuda: bool, waited_at_once: bool) -> str:
        """How this collective is timed: the option, with ``"auto"`` made ``"sync"`` for a CPU
        call the program waits for as soon as it returns (:func:`waited_at_once`) and
        ``"events"`` for the rest (said in ``metadata.timing``). ``metadata.timed_on`` says on
        whose clock the run's calls were timed: ``"host"``, ``"gpu"`` (a span from the host's
        issue lasting the kernel's time, which may have run later) or both."""
        timing = self.options.timing
        if timing != "off":
            clock = "gpu" if cuda else "host"
            if clock not in self._timed_on:
                self._timed_on.add(clock)
                self.trace.metadata["timed_on"] = sorted(self._timed_on)
        if timing != "auto":
            return timing
        timing = "sync" if waited_at_once and not cuda else "events"
        used = self._timing_used
        if timing not in used:
            used.add(timing)
            self.trace.metadata["timing"] = timing if len(used) == 1 else "auto"
            if len(used) == 2:
                self._note("auto", "timing: blocking CPU calls (async_op=False) timed by waiting for each (sync), the others "
                           "(CUDA collectives, async_op=True, functional collectives, send/recv) by events, never waited for")
        return timing

    def _events_issued(self, index: int, stamp: Any, cuda: bool, out: Any, spec: _ops.CollectiveSpec, group: GroupInfo) -> float | None:
        """After a call timed by events: where its end event goes (see EventTimer); the latency
        where it is known already (on CPU, a call that returned done)."""
        assert self._events is not None
        work = None if isinstance(out, torch.Tensor) else work_of(out)
        done = spec.returns_done or work is SYNCED
        after = work if cuda and not done and work is not None and self._groups.waits_on_stream(group.name) else None
        # CPU only: a CUDA Work's future (NCCL's) is marked done when its kernel is queued, not run
        completion = completion_of(work) if not cuda and not done and work is not None else None
        if completion is not None and len(self._events.completing) >= self._events.MOST // 2:
            self._events.collect(self._latency)  # a loop with no step boundary: read the done ones before any is dropped
        return self._events.issued(index, stamp, done, after, completion)

    def _waited(self, index: int) -> None:
        """InFlight's callback: the program's own wait for collective ``index`` returned (on any
        thread that waited)."""
        events = self._events
        if events is not None:
            before = events.at_wait
            seconds = events.waited(index)
            if before == 0 and events.at_wait:
                self._note("at_wait", AT_WAIT)
            if seconds is not None:
                self._latency(index, seconds)

    def _latency(self, index: int, seconds: float) -> None:
        event = self.trace.update_event(index, latency_s=seconds)
        if event is not None and self._listeners:
            self._emit(event)

    def _note(self, key: str, message: str) -> None:
        """A fact about this run's timing, said once: logged and kept in the dump."""
        notes = self.trace.metadata.setdefault("timing_notes", [])
        if message not in notes:
            notes.append(message)
            log.warning("commdebug: %s", message)

    def _join_timing(self) -> None:
        """Give the events their times measured since (step boundaries, exit, reads): NCCL's
        reported durations, the CUDA events that are done."""
        if self._async is not None:
            self._async.join(self._timed)
        if self._events is not None:
            self._events.collect(self._latency)

    def _timed(self, index: int, started_at: float | None, seconds: float | None) -> None:
        event = self.trace.update_event(index, start_s=None if started_at is None else started_at - self._t0_wall, latency_s=seconds)
        if event is not None and self._listeners:
            self._emit(event)

    def _finish_timing(self) -> None:
        if self._events is not None:
            self._events.collect(self._latency, final=True)  # the last ones, waited for here only
            if self._events.unknown:
                self._note("events:unknown", f"timing='events': {self._events.unknown} collective(s) have no latency: they never "
                           "finished, the program never waited for them, or it ended first (a time is never guessed)")
        if self._async is None:
            return
        for index in self._async.close(self._timed):  # never timed (not reported by NCCL): logged without a time
            pos = index - self.trace.events_dropped
            if self._listeners and 0 <= pos < len(self.trace.events):
                self._emit(self.trace.events[pos])
