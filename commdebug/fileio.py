"""Atomic file writes: an interrupted write never leaves a half file or destroys an earlier one."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from commdebug.errors import CommDebugError

__all__ = ["write_output", "open_atomic", "expand_placeholders", "output_folder", "output_file"]


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def expand_placeholders(name: str | os.PathLike, rank: int, world_size: int) -> str:
    """``name`` with ``{rank}`` and ``{world_size}`` replaced, so that every rank of a job can
    write its own file from the same line of code.

    >>> expand_placeholders("traces/rank{rank}-of-{world_size}.json", 3, 8)
    'traces/rank3-of-8.json'

    ``{{`` and ``}}`` stand for literal braces; any other ``{...}`` is an error naming it.
    """
    text = os.fspath(name)
    values = {"rank": rank, "world_size": world_size}

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise CommDebugError(f"unknown placeholder {{{key}}} in file name {text!r} (use {{rank}} or {{world_size}}; {{{{ and }}}} for braces)")
        return str(values[key])

    escaped = text.replace("{{", "\x00").replace("}}", "\x01")
    out = _PLACEHOLDER.sub(sub, escaped)
    if "{" in out or "}" in out:
        raise CommDebugError(f"unbalanced brace in file name {text!r} (use {{{{ and }}}} for literal braces)")
    return out.replace("\x00", "{").replace("\x01", "}")


def write_output(path: str | os.PathLike, content: str | Iterable[str]) -> Path:
    """Write a renderer's output, its text or its text chunks, to ``path``: through a temp file
    in the same folder and a rename, so a reader never sees half a file and a failed write
    leaves an earlier one as it was. Parent folders are created. Returns the resolved path.

    Every file commdebug writes goes through here.

    >>> write_output("table.txt", render_table(trace))                  # doctest: +SKIP
    >>> write_output("trace.json", ChromeTrace().render(iter_ranks(".")))  # doctest: +SKIP
    """
    with open_atomic(path) as f:
        if isinstance(content, str):
            f.write(content)
        else:
            for chunk in content:
                f.write(chunk)
    return Path(path).resolve()



@contextlib.contextmanager
def open_atomic(path: str | os.PathLike) -> Iterator[TextIO]:
    """A text file to write piece by piece that appears at ``path`` only when complete.

    >>> with open_atomic("trace.json") as f:   # doctest: +SKIP
    ...     f.write("...")
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise CommDebugError(f"cannot write {target}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise CommDebugError(f"cannot write {target}: {e.strerror or e}") from e
        raise


def output_folder(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Check (and create) a folder to write into before any long work starts; a plain error if
    it is empty, a file, or cannot be created."""
    text = os.fspath(path)
    if not text.strip():
        raise CommDebugError(f"the {what} is empty; give a folder name")
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise CommDebugError(f"{p}: exists and is not a folder (the {what} must be a folder)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommDebugError(f"cannot create the {what} {p}: {e.strerror or e}") from None
    return p


def output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """Check a file name to write before any long work starts: not empty, not a folder, and its
    parent not a file."""
    text = os.fspath(path)
    if not text.strip():
        raise CommDebugError(f"the {what} name is empty; give a file name")
    p = Path(text)
    if p.is_dir() or text.endswith(("/", os.sep)):
        raise CommDebugError(f"{p}: is a folder; the {what} must be a file name")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CommDebugError(f"{parent}: is a file, so {p} cannot be written")
            break
    return p
