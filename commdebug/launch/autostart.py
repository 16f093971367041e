"""Record a process from its start to its exit without changing its code.

Imported at interpreter start-up by the ``commdebug_autostart.pth`` hook (``commdebug hook
install``) when ``COMMDEBUG=1``:

    COMMDEBUG=1 COMMDEBUG_OUT=traces/ torchrun --nproc-per-node 4 train.py

Options come from the ``COMMDEBUG_*`` variables (docs/configuration.md), plus ``COMMDEBUG_OUT``
(folder, default ``commdebug_traces``), ``COMMDEBUG_HANG_TIMEOUT`` (seconds) and ``COMMDEBUG_HTML``
(``0``: no page from rank 0). The launcher
process itself and commdebug's own commands are left alone; a process that never joins a
process group (a DataLoader worker) writes nothing.

:func:`record` is the one way a process starts recording itself: the hook calls it with the
variables' options, and the processes a ``commdebug run`` program starts call it with the
run's (:mod:`commdebug.launch.children`).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["record"]

_session: Any = None  # this process's RecordingSession, once started


def not_the_program() -> bool:
    """True for processes that are not the program: launchers, commdebug's own commands, and
    multiprocessing's helpers (they never join a process group, and the forkserver's children
    leave through os._exit, which writes nothing)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    words = [os.path.basename(a) for a in argv[1:3]]
    launcher = {"torchrun", "torch.distributed.run", "torch.distributed.launch", "commdebug"}
    if launcher & set(words) or any(a in launcher for a in argv[1:3]):
        return True
    code = argv[2] if len(argv) > 2 and argv[1] == "-c" else ""
    return "multiprocessing.resource_tracker" in code or "multiprocessing.forkserver" in code


def record(out: str | os.PathLike, *, hang_timeout: float | None = None, html: bool = True, noise_level: int = 3,
           on_finish: Callable[[Any, Path | None], None] | None = None, **options: Any) -> Any:
    """Record this process into ``out`` until it exits; once per process (a second call
    returns the first session). ``on_finish(session, path)``: see :class:`RecordingSession`.

    >>> record("traces", hang_timeout=300, timing="sync")   # doctest: +SKIP
    """
    global _session
    if _session is None:
        from commdebug.launch.session import RecordingSession

        session = RecordingSession(out, hang_timeout=hang_timeout, noise_level=noise_level, html=html, on_finish=on_finish, **options)
        session.start()
        atexit.register(session.finish, "exit")
        _session = session
    return _session


def _from_environment() -> None:
    timeout = os.environ.get("COMMDEBUG_HANG_TIMEOUT", "").strip()
    try:
        hang = float(timeout) if timeout else None
    except ValueError:
        raise ValueError(f"COMMDEBUG_HANG_TIMEOUT must be a number of seconds, not {timeout!r}") from None
    html = os.environ.get("COMMDEBUG_HTML", "1").strip().lower() not in ("0", "false", "no", "off")
    record(os.environ.get("COMMDEBUG_OUT") or "commdebug_traces", hang_timeout=hang, html=html)


# the hook imports this module only when COMMDEBUG is set; anyone else importing it for
# record() must not start a recording from the variables
if os.environ.get("COMMDEBUG", "0") not in ("", "0") and not not_the_program():
    try:
        _from_environment()
    except Exception as e:  # never stop the program from starting
        print(f"commdebug: not recording: {e}", file=sys.stderr)
