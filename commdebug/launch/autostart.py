"""Record a job whose launch line cannot change: imported at interpreter start-up by the
``commdebug_autostart.pth`` hook (``commdebug hook install``) when ``COMMDEBUG=1``.

    COMMDEBUG=1 COMMDEBUG_OUT=traces/ torchrun --nproc-per-node 4 train.py

Options come from the ``COMMDEBUG_*`` variables (docs/configuration.md), plus ``COMMDEBUG_OUT``
(folder, default ``commdebug_traces``), ``COMMDEBUG_HANG_TIMEOUT`` (seconds) and ``COMMDEBUG_HTML``
(``0``: no page from rank 0). The launcher
process itself and commdebug's own commands are left alone; a process that never joins a
process group (a DataLoader worker) writes nothing.
"""

from __future__ import annotations

import atexit
import os
import sys


def _skip() -> bool:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    words = [os.path.basename(a) for a in argv[1:3]]
    launcher = {"torchrun", "torch.distributed.run", "torch.distributed.launch", "commdebug"}
    return bool(launcher & set(words)) or any(a in launcher for a in argv[1:3])


def _start() -> None:
    from commdebug.launch.session import RecordingSession

    timeout = os.environ.get("COMMDEBUG_HANG_TIMEOUT", "").strip()
    try:
        hang = float(timeout) if timeout else None
    except ValueError:
        raise ValueError(f"COMMDEBUG_HANG_TIMEOUT must be a number of seconds, not {timeout!r}") from None
    html = os.environ.get("COMMDEBUG_HTML", "1").strip().lower() not in ("0", "false", "no", "off")
    session = RecordingSession(os.environ.get("COMMDEBUG_OUT") or "commdebug_traces", hang_timeout=hang, html=html)
    session.start()
    atexit.register(session.finish, "exit")


if not _skip():
    try:
        _start()
    except Exception as e:  # never stop the program from starting
        print(f"commdebug: not recording: {e}", file=sys.stderr)
