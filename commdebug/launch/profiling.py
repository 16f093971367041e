"""``commdebug run --profile-steps A-B``: torch.profiler over commdebug's steps A to B (both
included) on every rank, written as ``<out>/rank<R>.profile.json.gz`` beside the rank's dump,
for ``commdebug overlap`` (docs/overlap.md).

The profiler starts at the step boundary into step A (or with the recording, when A is 0) and
stops at the boundary out of step B, or when the program ends; its ``ProfilerStep#N`` spans carry
commdebug's step numbers, so the trace and the dump name the same steps. Outside those steps
nothing is added: a step boundary costs one comparison. It records CPU activity, and CUDA's where
there is a GPU, with shapes (gloo's traces give sizes only through them). The file is written to
a hidden temporary name and renamed, like every output.

Said in one line each, never silently: a program already running its own profiler (only one can
run at a time: commdebug's is not started), steps outside what commdebug records
(``--start-step``/``--end-step``), ``--timing sync`` (it waits for every collective, so the
overlap measured is not the program's own), a program that ended before step A.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["StepProfiler"]

log = logging.getLogger("commdebug")


class StepProfiler:
    """torch.profiler over steps ``first``..``last`` of ``mode`` (a CommDebugMode), writing the
    trace into ``out`` as ``rank<R>.profile.json.gz``.

    >>> profiler = StepProfiler(mode, Path("traces"), (3, 5), rank_of=lambda meta: 0)   # doctest: +SKIP
    >>> profiler.start(); ...; profiler.finish()                                       # doctest: +SKIP
    """

    def __init__(self, mode: Any, out: Path, steps: tuple[int, int], *, rank_of: Callable[[dict[str, Any]], int]) -> None:
        self.mode = mode
        self.out = out
        self.first, self.last = steps
        self.rank_of = rank_of
        self.written: Path | None = None
        self.status = "waiting"  # waiting | running | written | skipped: <why> | failed: <why>
        self._prof: Any = None
        self._owner: int | None = None

    # ---- life cycle ---------------------------------------------------------------------------

    def start(self) -> StepProfiler:
        """Listen for step boundaries (and start now when step ``first`` is the current one)."""
        options = self.mode.options
        meta = self.mode.trace.metadata
        meta["profile_steps"] = [self.first, self.last]
        if options.windowed:  # what the dump holds, for the reader that joins the profile to it
            meta["start_step"], meta["end_step"] = options.start_step, options.end_step
        end = options.end_step
        if self.first < options.start_step or (end is not None and self.last >= end):
            self._say(f"--profile-steps {self.first}-{self.last} reaches outside the recorded steps (--start-step "
                      f"{options.start_step}, --end-step {end}): `commdebug overlap` will not join it to the dump")
        if options.timing == "sync":
            self._say("--profile-steps under --timing sync: every collective is waited for, so the profiled steps cannot "
                      "overlap communication with compute; profile without --timing to measure the program's own overlap")
        self._owner = threading.get_ident()
        self.mode.add_step_listener(self._at_boundary)
        if self.mode.trace.step == self.first:
            self._begin()
        return self

    def finish(self, quiet: bool = False) -> Path | None:
        """Stop (when still running, and called on the thread that started it) and write;
        ``quiet``: say nothing of a profile never started (a process that took no part)."""
        self.mode.remove_step_listener(self._at_boundary)
        if self._prof is not None and threading.get_ident() == self._owner:
            self._end()
        elif self.status == "waiting":
            self.status = "skipped: the program ended before step " + str(self.first)
            if not quiet:
                self._say(f"--profile-steps {self.first}-{self.last}: the program ended at step {self.mode.trace.step}, "
                          f"before step {self.first}: no profile written")
        self.mode.trace.metadata["profile"] = self.status
        return self.written

    # ---- steps --------------------------------------------------------------------------------

    def _at_boundary(self, step: int) -> None:
        if self._prof is None:
            if step == self.first and self.status == "waiting":
                self._begin()
            return
        if step > self.last:
            self._end()
        else:
            self._prof.step()

    def _begin(self) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        if torch._C._autograd._profiler_enabled():
            self.status = "skipped: the program runs its own profiler"
            self._say(f"--profile-steps: the program runs its own torch.profiler at step {self.first}, and only one can run "
                      "at a time: commdebug's was not started (`commdebug overlap` reads the program's own trace)")
            return
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            prof = profile(activities=activities, record_shapes=True, schedule=lambda _: ProfilerAction.RECORD)
            prof.step_num = self.first  # its ProfilerStep#N spans carry commdebug's step numbers
            prof.start()
        except Exception as e:  # the profiler cannot start here: the program runs on
            self.status = f"failed: {type(e).__name__}: {e}"
            self._say(f"--profile-steps: torch.profiler did not start ({type(e).__name__}: {e}); no profile written")
            return
        self._prof = prof
        self.status = "running"

    def _end(self) -> None:
        prof, self._prof = self._prof, None
        rank = self.rank_of(self.mode.trace.metadata)
        path = self.out / f"rank{rank}.profile.json.gz"
        tmp = self.out / f".rank{rank}.profile.{os.getpid()}.tmp.json.gz"
        try:
            prof.stop()
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, path)
        except Exception as e:  # never the program's failure
            self.status = f"failed: {type(e).__name__}: {e}"
            self._say(f"--profile-steps: the profile could not be written ({type(e).__name__}: {e})")
            try:
                tmp.unlink()
            except OSError:
                pass
            return
        self.written = path
        self.status = "written"

    def _say(self, message: str) -> None:
        log.warning("commdebug: %s", message)
