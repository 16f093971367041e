"""An error that torch raises in a collective commdebug runs for the program (the op itself, or
the wait ``timing="sync"`` adds) reaches the program without commdebug's frames in its
traceback: it reads as it would without commdebug, torch's frames and the program's.

Where the error comes from torch, the recorder marks it (:func:`mark`, through the in-flight
table that records the failure); each outermost frame of ours that it leaves by (the light
kernels' handlers, the dispatch mode's entry) takes every frame of the package out of it
(:func:`strip`). The dispatch mode's entry does so too for any error raised below it (an aten
op the program's model got wrong). An error raised by commdebug's own code is never marked and
keeps its frames: that one is ours to find.

    >>> try:
    ...     return handle(call)          # doctest: +SKIP
    ... except BaseException as e:
    ...     strip(e)
    ...     raise
"""

from __future__ import annotations

import os

__all__ = ["mark", "strip"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MARK = "_commdebug_from_torch"


def mark(error: BaseException) -> None:
    """``error`` came from torch, in a call made for the program: :func:`strip` may hide our frames."""
    try:
        setattr(error, _MARK, True)
    except (AttributeError, TypeError):  # an exception type without attributes: keeps its frames
        pass


def strip(error: BaseException, below: bool = False) -> None:
    """Take every commdebug frame out of a marked ``error``'s traceback (a bare ``raise`` after
    it adds no entry for the frame that raises, Python 3.11+). Costs only when an error passes.
    ``below``: also an unmarked one raised in code below ours (its innermost frame is not ours:
    an op the dispatch mode ran, torch's or the program's own code), never one ours raised."""
    if not getattr(error, _MARK, False) and not (below and _raised_below(error)):
        return
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    error.__traceback__ = tb
    while tb is not None:
        following = tb.tb_next
        while following is not None and following.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            following = following.tb_next
        tb.tb_next = following
        tb = following


def _raised_below(error: BaseException) -> bool:
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE)
