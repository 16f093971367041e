"""A rank's fault record: what a process that dies of a fatal signal leaves beside its dump.

SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL end a process before any Python code of ours can
run: no dump, a stream that ends with the call the process died in (each call is written to
it as it is issued: :mod:`commdebug.launch.stream`). :class:`FaultRecorder` arms the compiled
handler of :mod:`commdebug.launch._faults` (a chain link, not a replacement: whatever handled
those signals before, faulthandler writing to stderr included, still runs after it, and the
process dies of the same signal), which then writes ``<out>/rank<R>.fault``: the signal and
every thread's Python stack (format: :mod:`commdebug.model.fault`). Nothing is written when
nothing happens. The record names the rank, the pid and the run id, so that the readers tie it
to this process's dump or stream and never to an earlier run's.

The rank may be unknown when the recording starts (no ``RANK`` variable: ``mp.spawn``, a
program that sets up its process group itself): the record is then named ``pid<P>.fault``
until the session learns the rank, at the first step boundary or dump after the process
group exists. Re-arming changes a path and a header: it costs a comparison when nothing
changed, and runs at step boundaries only, never per collective.

Without the compiled helper (no C compiler at install, another Python than CPython 3.11-3.12)
nothing is recorded, and the readers say the cause is unknown.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from commdebug.model.fault import FAULT_SUFFIX, header_text

__all__ = ["FaultRecorder", "AVAILABLE"]

_arm: Any
try:
    from commdebug.launch._faults import arm as _arm
except ImportError:  # not built, or a Python whose internals it cannot call
    _arm = None

AVAILABLE = _arm is not None


class FaultRecorder:
    """Keep the fault handler pointed at this process's record in ``out``.

    >>> faults = FaultRecorder(Path("traces"))     # doctest: +SKIP
    >>> faults.arm(rank=None, run_id=None)          # pid<P>.fault until the rank is known   # doctest: +SKIP
    >>> faults.arm(rank=1, run_id="2026...")         # rank1.fault from now on               # doctest: +SKIP
    """

    def __init__(self, out: Path) -> None:
        self.out = Path(os.path.abspath(out))  # a program may change its working folder
        self.path: Path | None = None
        self._armed: tuple[int | None, str | None] | None = None

    def arm(self, rank: int | None, run_id: str | None) -> None:
        """Point the record at ``rank<rank>.fault`` (``pid<P>.fault`` while the rank is None),
        headed with the rank, pid and run id; a no-op when they did not change."""
        key = (rank, run_id)
        if _arm is None or key == self._armed:
            return
        path = self.out / ((f"rank{rank}" if rank is not None else f"pid{os.getpid()}") + FAULT_SUFFIX)
        if path != self.path:
            # an earlier run's record of this rank in a reused folder: this run replaces it, as it
            # replaces that rank's dump and stream (the readers would not blame it on us anyway)
            try:
                path.unlink()
            except OSError:
                pass
        main = threading.main_thread().ident or 0
        try:
            _arm(str(path), header_text(rank, os.getpid(), run_id, main))
        except OSError:  # cannot install the handler: record nothing, never stop the program
            return
        self.path, self._armed = path, key
