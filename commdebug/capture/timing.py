"""How long each collective took: two ways to measure it.

- :class:`SyncTimer` waits for the collective and times it: CUDA events on CUDA tensors (the
  start event is recorded on the current stream before the collective, the end event after
  waiting for it, so queued compute before the call is not counted), the host clock on CPU
  (issuing plus waiting, without the recorder's own work in between).
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
from typing import Any, NamedTuple

import torch

from commdebug.capture.config import NCCL_HOOK_ENV

__all__ = ["SyncTimer", "AsyncTimer", "WorkDone", "nvtx_label", "on_cuda", "waits_on_stream"]

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
    """Times one collective by waiting for it, leaving out what the recorder does between
    issuing it and waiting (the event is recorded before the wait, so that a collective that
    hangs or raises in the wait is in the dump). With ``early`` (CUDA, where the wait returns at
    once), :meth:`stop_early` stops the clock before the recorder's work instead.

    >>> timer = SyncTimer(on_cuda=False)
    >>> timer.start(); out = issue(); timer.issued(); record(out); timer.wait(lambda: wait(out))  # doctest: +SKIP
    >>> timer.seconds                                                                             # doctest: +SKIP
    """

    __slots__ = ("on_cuda", "early", "host_start", "seconds", "_issue_s", "_stopped", "_start", "_end")

    def __init__(self, on_cuda: bool, early: bool = False) -> None:
        self.on_cuda, self.early = on_cuda, early
        self.seconds: float | None = None
        self._issue_s = 0.0
        self._stopped = False
        if on_cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        """Just before the collective is issued."""
        self.host_start = time.perf_counter()
        if self.on_cuda:
            self._start.record()  # on the current stream: queued compute before it is not counted

    def issued(self) -> None:
        """Just after the call that issued it returned."""
        self._issue_s = time.perf_counter() - self.host_start

    def stop_early(self, wait: Callable[[], None]) -> None:
        """Right after :meth:`issued`: if ``early``, wait with ``wait()`` and stop the clock now."""
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
        waited_from = time.perf_counter()
        wait()
        if self.on_cuda:
            self._end.record()
        else:
            self.seconds = self._issue_s + (time.perf_counter() - waited_from)

    def finish(self) -> float:
        """After :meth:`stop`: the latency in seconds (on CUDA, once the end event has happened)."""
        if self.on_cuda:
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        assert self.seconds is not None
        return self.seconds


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
