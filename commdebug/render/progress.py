"""A one-line progress meter for verbs that read a folder of ranks: ``ranks read 512/1024
(85 ranks/s)`` on stderr, redrawn in place, and only where a person watches (stderr is a
terminal): a log file or a pipe gets none of it, so scripts see the same output as before.

>>> with Progress.for_stream(sys.stderr, "ranks read") as meter:     # doctest: +SKIP
...     result = report(iter_selected("traces/", progress=meter))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO

__all__ = ["Progress", "progress_line"]

# redraws per second at most: a terminal repaint is not free, and faster is unreadable
_RATE = 8.0


def progress_line(what: str, done: int, total: int, seconds: float) -> str:
    """``ranks read 512/1024 (50%, 85 ranks/s)``: what a meter shows after `seconds`."""
    share = f"{100 * done // total}%, " if total else ""
    rate = f"{done / seconds:,.0f} ranks/s" if seconds > 0 and done else "starting"
    return f"{what} {done:,}/{total:,} ({share}{rate})"


class Progress:
    """Called as ``meter(done, total)``; draws :func:`progress_line` over itself on `stream`,
    at most a few times a second, and ``done()`` clears it. A meter made for a stream that is
    not a terminal, or with ``quiet``, draws nothing. As a context manager it clears its line
    on the way out, however the work ended."""

    def __init__(self, stream: IO[str] | None, what: str = "ranks read", clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.what = what
        self.clock = clock
        self.start = clock()
        self.last = -1.0
        self.shown = False

    @classmethod
    def for_stream(cls, stream: IO[str], what: str = "ranks read", quiet: bool = False) -> Progress:
        """A meter on `stream` when it is a terminal and not `quiet`; else a silent one."""
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):  # closed or not a real file
            tty = False
        return cls(stream if tty and not quiet else None, what)

    def __call__(self, done: int, total: int) -> None:
        if self.stream is None:
            return
        now = self.clock()
        if done < total and now - self.last < 1 / _RATE:
            return
        self.last = now
        # \r and erase-to-end-of-line: the line is redrawn in place, never scrolls
        self.stream.write("\r\x1b[K" + progress_line(self.what, done, total, now - self.start))
        self.stream.flush()
        self.shown = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()

    def done(self) -> None:
        """Erase the meter's line, so what follows starts on a clean line."""
        if self.stream is not None and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
