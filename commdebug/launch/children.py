"""Record the Python processes a ``commdebug run`` program starts, such as the ranks of
``torch.multiprocessing.spawn`` (PyTorch's DDP tutorial), each into the run's folder with the
run's options.

    with ChildRecording("traces", {"hang_timeout": 300, "options": {"timing": "sync"}}):
        run_the_program()

A spawned child is a fresh interpreter: it inherits nothing of the parent's recording but its
environment. So, for the duration, a folder holding a ``sitecustomize.py`` and the run's
settings goes first on ``PYTHONPATH``; Python imports ``sitecustomize`` at start-up, and ours
first runs the one it hides (the environment's own, if any), then starts recording through
:func:`commdebug.launch.autostart.record`. Processes started with ``python -I``, ``-E`` or
``-S``, and processes forked without a new interpreter, are not recorded.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ChildRecording", "start_child"]

SETTINGS = "settings.json"
PREFIX = "commdebug-run-"  # the folder's name: PREFIX, <pid>@<host>+<pid namespace> of the process that made it, "-", a random part

# The start-up module every child runs. Plain standard library until it knows the process is
# one to record: importing commdebug imports torch (seconds), which multiprocessing's helper
# processes (resource tracker, forkserver) must not pay for nothing.
SITECUSTOMIZE = '''"""Written by `commdebug run` (commdebug/launch/children.py), first on the PYTHONPATH of the
program it runs, so that every Python process the program starts records itself."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _chain():
    # the sitecustomize this one hides (the environment's own), run as Python would have
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as e:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n{type(e).__name__}: {e}", file=sys.stderr)


def _helper():
    argv = getattr(sys, "orig_argv", sys.argv)
    code = argv[2] if len(argv) > 2 and argv[1] == "-c" else ""
    return "multiprocessing.resource_tracker" in code or "multiprocessing.forkserver" in code


_chain()
if not _helper():
    try:
        from commdebug.launch.children import start_child
    except ImportError as e:  # another interpreter, without commdebug
        print(f"commdebug: not recording process {os.getpid()}: {e}", file=sys.stderr)
    else:
        start_child(os.path.join(_here, "settings.json"))
'''


class ChildRecording:
    """While entered, every Python process started from this one records itself into ``out``
    with ``settings`` (``hang_timeout``, ``noise_level``, ``html``, and the mode's ``options``),
    as :func:`commdebug.launch.autostart.record` takes them. On leaving, ``dumps`` holds the
    final dumps the children wrote, by pid.

    >>> with ChildRecording("traces", {"options": {"timing": "sync"}}):   # doctest: +SKIP
    ...     mp.spawn(train, nprocs=2)
    """

    def __init__(self, out: str | os.PathLike, settings: dict[str, Any]) -> None:
        # absolute: a program may change its working folder before it starts its ranks
        self.settings = {**settings, "out": os.path.abspath(out)}
        self.dumps: dict[int, Path] = {}  # pid -> final dump, of the children that wrote one
        self._folder: str | None = None
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> ChildRecording:
        _sweep(Path(tempfile.gettempdir()))
        self._folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}@{_machine()}-")
        Path(self._folder, "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        Path(self._folder, SETTINGS).write_text(json.dumps(self.settings), encoding="utf-8")
        path = os.environ.get("PYTHONPATH")
        self._set("PYTHONPATH", self._folder + (os.pathsep + path if path else ""))
        if os.environ.get("COMMDEBUG", "0") not in ("", "0"):
            # the global start-up hook would record the children a second time, elsewhere
            self._set("COMMDEBUG", "0")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give the environment back, keep the children's reports in ``dumps``, remove the
        folder; again is a no-op (the parent's SIGTERM path calls it before dying)."""
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()
        if self._folder is not None:
            self.dumps = _reported(Path(self._folder))
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _set(self, name: str, value: str) -> None:
        self._saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value


def _machine() -> str:
    """Where a pid means this process's neighbours: the host name, and the pid namespace (two
    containers that share a host name and a temporary folder number their processes apart)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux
        namespace = 0
    return f"{socket.gethostname()}+{namespace}"


def _sweep(tmp: Path) -> None:
    """Remove the folders that runs killed with SIGKILL left in `tmp` (nothing in a process can
    run at SIGKILL to remove its own): those whose maker no longer runs on this host. A live
    maker's folder, another host's or container's (a shared TMPDIR), another user's and one
    named otherwise are left alone."""
    try:
        entries = list(tmp.glob(f"{PREFIX}*@*-*"))
    except OSError:
        return
    here = _machine()
    for folder in entries:
        pid, _, host = folder.name[len(PREFIX):].rpartition("-")[0].partition("@")
        if host != here or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OverflowError, OSError):  # another user's process (PermissionError), or no such number
            continue


def start_child(settings_file: str) -> None:
    """Start recording this process with the settings a ``commdebug run`` parent left in
    ``settings_file``; called by the generated ``sitecustomize`` at interpreter start-up.
    Never stops the process from starting: a problem is one line on stderr."""
    from commdebug.launch import autostart

    if autostart.not_the_program():  # a launcher the program started: its own children are the ranks
        return
    try:
        settings = json.loads(Path(settings_file).read_text(encoding="utf-8"))
        done = functools.partial(_finished, Path(settings_file).parent)
        autostart.record(settings["out"], hang_timeout=settings.get("hang_timeout"), html=settings.get("html", True),
                         noise_level=settings.get("noise_level", 3), on_finish=done, **settings.get("options", {}))
    except Exception as e:
        print(f"commdebug: not recording process {os.getpid()}: {e}", file=sys.stderr)


def _finished(folder: Path, session: Any, path: Path | None) -> None:
    """At a child's exit, its final dump on disk: say so, as the last line before a crash in
    interpreter teardown could make the user think otherwise, and tell the parent."""
    from commdebug.launch.session import rank_of, say

    if path is None:  # never joined a process group: nothing to tell
        return

    rank = rank_of(session.mode.trace.metadata)
    how = "finished" if session.reason == "exit" else f"ended by {session.reason}"
    say(f"commdebug: rank {rank} (pid {os.getpid()}) {how}; dump complete: {path}")
    try:
        (folder / f"{_DONE}{os.getpid()}").write_text(str(path), encoding="utf-8")
    except OSError:  # the parent is gone already: nobody to tell
        pass


_DONE = "done-"  # a child's report: done-<pid>, holding the path of its final dump


def _reported(folder: Path) -> dict[int, Path]:
    """The final dumps the children reported in ``folder``, by pid, in rank-file order."""
    dumps = {}
    for marker in folder.glob(_DONE + "*"):
        try:
            dumps[int(marker.name[len(_DONE):])] = Path(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return dict(sorted(dumps.items(), key=lambda kv: (len(kv[1].stem), kv[1].stem)))
