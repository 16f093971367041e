"""``commdebug run``: run a script or module, unchanged, under CommDebugMode.

    torchrun --nproc-per-node 4 -m commdebug run --out traces/ --timing -- train.py --lr 3e-4
    python -m commdebug run --out traces/ -- train.py      # train.py starts its ranks with mp.spawn

The program sees its own argv and runs as ``__main__``; its exit status is kept (``sys.exit``
codes, 1 for an uncaught exception with its traceback, death by SIGTERM). The Python processes it
starts record themselves with the same options (:mod:`commdebug.launch.children`). The last line
on stderr says how the program ended and which dumps are complete, or why nothing was recorded:
it comes before interpreter teardown, so a crash there (torch 2.13's gloo sometimes aborts)
follows a line saying the recording is safe.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from commdebug.launch.children import ChildRecording
from commdebug.launch.session import RecordingSession

__all__ = ["run_program"]


def run_program(target: list[str], module: bool, out_dir: str, *, hang_timeout: float | None = None, noise_level: int = 3, **options: Any) -> int:
    """Run ``target`` (script path and its arguments, or module name and its arguments when
    ``module``) under a recording session; return the program's exit status.

    >>> run_program(["train.py", "--lr", "3e-4"], False, "traces", timing="sync")   # doctest: +SKIP
    0
    """
    session = RecordingSession(out_dir, hang_timeout=hang_timeout, noise_level=noise_level, **options)
    name, argv = target[0], target[1:]
    if not module and not os.path.isfile(name):
        from commdebug.errors import CommDebugError

        raise CommDebugError(f"{name}: no such script (use -m NAME to run a module)")
    sys.argv = [name, *argv]
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(name)))  # as `python script.py` does
    children = ChildRecording(session.out, {"hang_timeout": hang_timeout, "noise_level": noise_level, "html": session.html, "options": options})
    session.on_finish = lambda *_: children.close()  # SIGTERM ends this process past the finally below
    status, reason, error = 0, "exit", None
    session.start()
    try:
        with children:
            status, reason, error = _run(name, module)
    finally:
        own = session.finish(reason=reason)
        theirs = {pid: _as_given(path, session.out) for pid, path in children.dumps.items()}
        _explain_death(error, theirs)
        print(_ending(status, own, list(theirs.values()), session.out), file=sys.stderr, flush=True)
    return status


def _run(name: str, module: bool) -> tuple[int, str, BaseException | None]:
    """Run the program as ``python [-m] name`` would; its (status, how it ended, its error)."""
    try:
        if module:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        return _exit_status(e.code), f"sys.exit({e.code!r})", None
    except KeyboardInterrupt as e:
        traceback.print_exc()
        return 130, "KeyboardInterrupt", e
    except BaseException as e:  # the program's own error: print it as python would
        traceback.print_exc()
        return 1, f"{type(e).__name__}: {e}", e
    return 0, "exit", None


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def _ending(status: int, own: Path | None, theirs: list[Path], out: Path) -> str:
    """The last line: how the program ended and which dumps are complete, or why none is."""
    program = "program finished" if status == 0 else "program ended"
    if own is None and not theirs:
        return (f"commdebug: recorded nothing: the program (exit {status}) never initialised torch.distributed in this "
                f"process, and no Python process it started wrote a dump to {out}")
    if not theirs:
        return f"commdebug: {program} (exit {status}); dump complete: {own}"
    started = "written by the processes it started: " + ", ".join(map(str, theirs))
    mine = f"{own}; " if own is not None else ""
    return f"commdebug: {program} (exit {status}); dumps complete, {mine}{started}"


def _explain_death(error: BaseException | None, dumps: dict[int, Path]) -> None:
    """When the program failed because a process it started died of a signal (what
    ``mp.spawn`` raises) after that process had written its final dump, say so: the traceback
    reads like the program's failure, but the crash came in that process's interpreter teardown."""
    pid, signal_name = getattr(error, "error_pid", None), getattr(error, "signal_name", None)
    if pid not in dumps or not signal_name:
        return
    rank = _metadata(dumps[pid]).get("rank", "?")
    print(f"commdebug: process {pid} (rank {rank}) died of {signal_name} after it finished: its dump {dumps[pid]} is "
          "complete; the crash came in its interpreter's teardown, after the program's code", file=sys.stderr)


def _metadata(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["commdebug"]["metadata"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _as_given(path: Path, out: Path) -> Path:
    """A child's dump (absolute) named as the user named the folder, ``traces/rank1.json``."""
    return out / path.name if os.path.abspath(path.parent) == os.path.abspath(out) else path
