"""Atomic file writes: an interrupted write never leaves a half file or destroys an earlier one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from commdebug.errors import CommDebugError

__all__ = ["write_text_atomic", "open_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file in the same folder and a rename.

    Parent folders are created. Returns the resolved path.
    """
    with open_atomic(path) as f:
        f.write(text)
    return Path(path).resolve()


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike) -> Iterator[IO[str]]:
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
