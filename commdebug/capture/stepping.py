"""When the recorder records: step boundaries, the ``start_step``/``end_step`` window, and
``detail_every``'s switch between the dispatch mode (a detail step) and light capture's
kernels; and who is told then (step and issue listeners). A part of :class:`~commdebug.capture.recorder.Recorder`, kept apart because it is the
one place that pushes and pops the dispatch mode."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

if TYPE_CHECKING:
    from commdebug.capture.config import Options
    from commdebug.capture.pipelining import PipelineTags
    from commdebug.capture.tracker import ModuleTracker
    from commdebug.model.trace import CollectiveEvent, Trace

__all__ = ["Stepping", "say_once"]

log = logging.getLogger("commdebug")
_SAID: set[str] = set()


def say_once(key: str, message: str) -> None:
    """Log a warning once per process (a fact about the environment, not about one call)."""
    if key not in _SAID:
        _SAID.add(key)
        log.warning("commdebug: %s", message)


class Stepping(TorchDispatchMode):
    """Step boundaries and what is on the dispatch mode stack; the Recorder's base, whose
    state (``trace``, ``options``, ``_tracker``, ``_pipeline``, ``_mode_on``, ``_light_on``,
    ``_paused``, ``_active``) it reads and sets."""

    step_listeners: list[Callable[[int], None]] = []  # per instance once one is added
    issue_listeners: list[Callable[[CollectiveEvent], None]] = []  # likewise

    if TYPE_CHECKING:  # the Recorder's state, set by its _reset
        options: Options
        trace: Trace
        _tracker: ModuleTracker
        _pipeline: PipelineTags
        _mode_on: bool
        _light_on: bool
        _paused: bool
        _active: bool
        _recorded_s: float
        _resumed_at: float
        _events_at_boundary: int
        _forwards_at_boundary: int
        _last_boundary_automatic: bool
        _last_dtensor: tuple[Any, ...] | None

        @property
        def auto_step(self) -> bool: ...

        def _join_timing(self) -> None: ...

    def _pause(self) -> None:
        """Stop recording without leaving the context: the dispatch mode is popped and the
        global hooks removed, so the program runs at close to bare speed; state is kept."""
        if self._paused or not self._active:
            return
        self._recorded_s += time.perf_counter() - self._resumed_at
        self._tracker.pause()
        self._pipeline.__exit__()
        self._pop_mode()
        self._light_on = False
        self._paused = True

    def _resume(self) -> None:
        """Record again after :meth:`_pause`."""
        if not self._paused:
            return
        self._paused = False
        if self.options.light:
            self._apply_detail()
        else:
            self._push_mode()
        self._pipeline.__enter__()
        self._tracker.resume()
        self._resumed_at = time.perf_counter()

    def _push_mode(self) -> None:
        if not self._mode_on:
            TorchDispatchMode.__enter__(self)
            self._mode_on = True

    def _pop_mode(self) -> None:
        if self._mode_on:
            TorchDispatchMode.__exit__(self, None, None, None)
            self._mode_on = False

    def _apply_detail(self) -> None:
        """Light capture: the dispatch mode on the stack for this step if it is a detail step
        (``detail_every``), else the light kernels record."""
        every = self.options.detail_every
        step = self.trace.step
        if every is not None and step % every == 0:
            self._light_on = False
            self._tracker.use_calls(False)
            self._push_mode()
            steps = self.trace.metadata.setdefault("detail_steps", [])
            if step not in steps:
                steps.append(step)
            return
        if self._mode_on:
            if _get_current_dispatch_mode() is not self:  # another mode was pushed after ours
                say_once("detail", "a dispatch mode entered after CommDebugMode is active: detail stays on")
                return
            self._pop_mode()
        self._last_dtensor = None  # light steps see no DTensor op
        self._tracker.use_calls(True)
        self._light_on = True

    def step(self) -> int:
        """Mark a step boundary; returns the current step index.

        Every call counts, except right after ``optimizer.step()`` marked one (when
        ``auto_step``) with no forward pass and no collective in between: calling both counts
        one step. With ``start_step``/``end_step``, recording starts and stops here (also
        while paused, when nothing is recorded between two calls).
        """
        return self._boundary(automatic=False)

    def _boundary(self, automatic: bool) -> int:
        tracker = self._tracker
        work = self.trace.events_total > self._events_at_boundary or tracker.forwards > self._forwards_at_boundary
        # an automatic boundary needs work since the last one; an explicit one only needs not
        # to repeat the automatic boundary just marked
        if work or not (automatic or self._last_boundary_automatic):
            self._events_at_boundary = self.trace.events_total
            self._forwards_at_boundary = tracker.forwards
            self._last_boundary_automatic = automatic
            self.trace.step += 1
            tracker.step_ended()
            self._join_timing()
            if self.options.windowed:
                self._enter_window(self.trace.step)
            if self.options.detail_every is not None and self._active and not self._paused:
                self._apply_detail()
            for listener in self.step_listeners:
                listener(self.trace.step)
        return self.trace.step

    def add_step_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(step)`` at each step boundary, with the step that begins, on the
        program's thread (``commdebug run``'s streamer flushes the step that ended). Keep it
        short: it runs inside the program's ``optimizer.step()``."""
        self.step_listeners = [*self.step_listeners, listener]

    def remove_step_listener(self, listener: Callable[[int], None]) -> None:
        self.step_listeners = [f for f in self.step_listeners if f is not listener]

    def add_issue_listener(self, listener: Callable[[CollectiveEvent], None]) -> None:
        """Call ``listener(event)`` with each event as it is recorded: on the thread that issued
        the collective, right after the call returned and before anything waits for it (also
        for a call that raised: the event's error comes later, as an update). ``commdebug run``'s
        streamer writes each event then, so that a process killed inside the collective leaves
        it. It runs for every collective: keep it short, and never let it raise.

        >>> mode.add_issue_listener(lambda event: print(event.op, event.seq))   # doctest: +SKIP
        """
        self.issue_listeners = [*self.issue_listeners, listener]

    def remove_issue_listener(self, listener: Callable[[CollectiveEvent], None]) -> None:
        self.issue_listeners = [f for f in self.issue_listeners if f is not listener]

    def _enter_window(self, step: int) -> None:
        end = self.options.end_step
        inside = step >= self.options.start_step and (end is None or step < end)
        if inside:
            self._resume()
        elif not self._mode_on or _get_current_dispatch_mode() is self or self._paused:
            self._pause()
        else:  # another mode was pushed after ours: we cannot pop from under it
            say_once("window", "a dispatch mode entered after CommDebugMode is active: the step window cannot pause recording")

    def _on_optimizer_step(self) -> None:
        if self.auto_step:
            self._boundary(automatic=True)
