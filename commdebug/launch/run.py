"""``commdebug run``: run a script or module, unchanged, under CommDebugMode.

    torchrun --nproc-per-node 4 -m commdebug run --out traces/ --timing -- train.py --lr 3e-4
    python -m commdebug run --out traces/ -- train.py      # train.py starts its ranks with mp.spawn

The program sees its own argv and runs as ``__main__``; its exit status is kept (``sys.exit``
codes, 1 for an uncaught exception, death by SIGTERM), and an uncaught exception is printed as
``python prog.py`` (or ``python -m module``) prints it: through ``sys.excepthook``, without the
frames of commdebug and of the runpy calls that started the program. The Python processes it
starts record themselves with the same options (:mod:`commdebug.launch.children`).

A program that fails (or gets SIGTERM) says so on stderr before its dump is written, so a rank
that a launcher kills a moment later has said how it ended. The last line on stderr says how
the program ended and which dumps are complete, or why nothing was recorded: it comes before
interpreter teardown, so a crash there (torch 2.13's gloo sometimes aborts) follows a line
saying the recording is safe.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import types
from pathlib import Path
from typing import Any

from commdebug.launch.children import ChildRecording
from commdebug.launch.session import RecordingSession, say
from commdebug.model.fault import is_program

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
    ended = _Ended()

    def done(session: RecordingSession, own: Path | None) -> None:
        # called once the dump is on disk, however the program ended: SIGTERM ends this
        # process right after, past the finally below
        children.close()
        theirs = {pid: _as_given(path, session.out) for pid, path in children.dumps.items()}
        _explain_death(ended.error, theirs)
        # SIGTERM and os._exit end the program past the finally below: the status there is not theirs
        how = f"by {session.reason}" if session.reason == "SIGTERM" or session.reason.startswith("os._exit(") else None
        say(_ending(ended.status, own, list(theirs.values()), session.out, how))

    session.on_finish = done
    session.start()
    try:
        with children:
            ended.status, ended.reason, ended.error = _run(name, module)
    finally:
        if ended.error is not None and not isinstance(ended.error, KeyboardInterrupt):
            raised = raised_at(ended.error)
            if raised is not None:  # the dump says where the program raised, not only what
                session.mode.trace.metadata["raised_at"] = raised
        if ended.status != 0:
            session.announce(f"ended (exit {ended.status})")
        session.finish(reason=ended.reason)
    return ended.status


class _Ended:
    """How the program ended, once known: its exit status, the reason the dump records, its error."""

    status = 0
    reason = "exit"
    error: BaseException | None = None


def _run(name: str, module: bool) -> tuple[int, str, BaseException | None]:
    """Run the program as ``python [-m] name`` would; its (status, how it ended, its error)."""
    try:
        if module:
            _run_module(name)
        else:
            # an absolute path, as `python script.py` gives its __main__ (__file__, tracebacks)
            runpy.run_path(os.path.abspath(name), run_name="__main__")
    except SystemExit as e:
        return _exit_status(e.code), f"sys.exit({e.code!r})", None
    except KeyboardInterrupt as e:
        _print_uncaught(e, name, module)
        return 130, "KeyboardInterrupt", e
    except BaseException as e:  # the program's own error: print it as python would
        _print_uncaught(e, name, module)
        return 1, f"{type(e).__name__}: {e}", e
    return 0, "exit", None


def raised_at(error: BaseException) -> dict[str, Any] | None:
    """Where the program raised ``error``: the innermost frame of its own code in the traceback
    (not torch's, commdebug's or the standard library's), as ``{"file", "line", "function"}``;
    None where the traceback holds none (an error raised before the program ran)."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append({"file": tb.tb_frame.f_code.co_filename, "line": tb.tb_lineno, "function": tb.tb_frame.f_code.co_name})
        tb = tb.tb_next
    return next(filter(is_program, reversed(frames)), None)  # innermost first


def _run_module(name: str) -> None:
    """``python -m name``: what the interpreter itself calls for ``-m`` (runpy's
    ``_run_module_as_main``: argv[0] becomes the module's file, a module that cannot be found
    exits with python's message), run in a ``__main__`` module of its own, so commdebug's own
    ``__main__`` is left as it was."""
    ours = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]
    finally:
        sys.modules["__main__"] = ours


def _print_uncaught(error: BaseException, name: str, module: bool) -> None:
    """Print an uncaught exception as the interpreter does for ``python [-m] name``: through
    ``sys.excepthook`` (the program may have set its own), its traceback starting at the
    program's first frame (the script's module code; for ``-m``, runpy's
    ``_run_module_as_main``, which python shows too), chained exceptions as they are."""
    tb = error.__traceback__
    if module:
        start = runpy._run_module_as_main.__code__  # type: ignore[attr-defined]
        while tb is not None and tb.tb_frame.f_code is not start:
            tb = tb.tb_next
    else:
        script = os.path.abspath(name)
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
    # no frame of the program (a syntax error, found before it ran): the error alone, as python
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def _ending(status: int, own: Path | None, theirs: list[Path], out: Path, how: str | None = None) -> str:
    """The last line: how the program ended and which dumps are complete, or why none is.
    ``how``: "by SIGTERM" when the signal ended it, else the exit status says."""
    program = f"program ended {how}" if how else "program finished (exit 0)" if status == 0 else f"program ended (exit {status})"
    if own is None and not theirs:
        # what is known: no collective, and no process group at the end (a program may make one and
        # destroy it without a collective, as a world of one often does)
        return (f"commdebug: recorded nothing: the program ({f'ended {how}' if how else f'exit {status}'}) issued no collective in "
                f"this process and had no process group when it ended, and no Python process it started wrote a dump to {out}")
    if not theirs:
        return f"commdebug: {program}; dump complete: {own}"
    started = "written by the processes it started: " + ", ".join(map(str, theirs))
    mine = f"{own}; " if own is not None else ""
    return f"commdebug: {program}; dumps complete, {mine}{started}"


def _explain_death(error: BaseException | None, dumps: dict[int, Path]) -> None:
    """When the program failed because a process it started died of a signal (what
    ``mp.spawn`` raises) after that process had written its final dump, say so: the traceback
    reads like the program's failure, but the crash came in that process's interpreter teardown."""
    pid, signal_name = getattr(error, "error_pid", None), getattr(error, "signal_name", None)
    if pid not in dumps or not signal_name:
        return
    rank = _metadata(dumps[pid]).get("rank", "?")
    say(f"commdebug: process {pid} (rank {rank}) died of {signal_name} after it finished: its dump {dumps[pid]} is "
        "complete; the crash came in its interpreter's teardown, after the program's code")


def _metadata(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["commdebug"]["metadata"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _as_given(path: Path, out: Path) -> Path:
    """A child's dump (absolute) named as the user named the folder, ``traces/rank1.json``."""
    return out / path.name if os.path.abspath(path.parent) == os.path.abspath(out) else path
