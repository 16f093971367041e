"""``commdebug run``: run a script or module, unchanged, under CommDebugMode.

    torchrun --nproc-per-node 4 -m commdebug run --out traces/ --timing -- train.py --lr 3e-4

The program sees its own argv and runs as ``__main__``; its exit status is kept (``sys.exit``
codes, 1 for an uncaught exception with its traceback, death by SIGTERM).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Any

from commdebug.launch.session import RecordingSession

__all__ = ["run_program"]


def run_program(target: list[str], module: bool, out_dir: str, *, hang_timeout: float | None = None, noise_level: int = 3, **options: Any) -> int:
    """Run ``target`` (script path and its arguments, or module name and its arguments when
    ``module``) under a recording session; return the program's exit status."""
    session = RecordingSession(out_dir, hang_timeout=hang_timeout, noise_level=noise_level, **options)
    name, argv = target[0], target[1:]
    if not module and not os.path.isfile(name):
        from commdebug.errors import CommDebugError

        raise CommDebugError(f"{name}: no such script (use -m NAME to run a module)")
    sys.argv = [name, *argv]
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(name)))  # as `python script.py` does
    session.start()
    status = 0
    reason = "exit"
    try:
        if module:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        status = _exit_status(e.code)
        reason = f"sys.exit({e.code!r})"
    except KeyboardInterrupt:
        status, reason = 130, "KeyboardInterrupt"
        traceback.print_exc()
    except BaseException as e:  # the program's own error: print it as python would
        status, reason = 1, f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        path = session.finish(reason=reason)
        if path is not None:
            print(f"commdebug: wrote {path}", file=sys.stderr)
    return status


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1
