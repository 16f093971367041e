"""The call a rank that died was in, where the evidence says so: one rule for ``check``,
``watch`` and the folder page.

A rank killed by a signal (or whose process is gone) leaves a record that may stop before what
it did last: its stream flushes every second or so, and a native abort runs no Python. Two
pieces of evidence name its last call anyway:

- the peers' records: where another member of a group completed a call (an op that needs every
  member, :func:`commdebug.ops.needs_all`) after the rank's record stops, the rank issued it: its
  last call is at least that one;
- its fault record: the line of the program the main thread was at when the signal came. Where it
  is the source line of one of those calls (or of its own last recorded call), it died in that call.

    >>> died = died_in([Candidate("all_to_all", "default_pg[2]", 7, "job.py:21", None, 1, 0)], own, fault)   # doctest: +SKIP
    >>> died.call.seq, died.completed_by, died.fault_line                                                 # doctest: +SKIP
    (7, 0, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commdebug.model.fault import fault_line

__all__ = ["Candidate", "DiedIn", "died_in"]


@dataclass(frozen=True)
class Candidate:
    """A call a rank issued that its own record may lack: another member's record shows it
    completed (``completed_by``), or it is the rank's own last recorded call (None)."""

    op: str
    group: str  # label
    seq: int | None
    source: str | None
    module: str | None
    step: int | None
    completed_by: int | None


@dataclass(frozen=True)
class DiedIn:
    """The call a rank's last evidence names: ``call``, which member's record shows it issued it
    (``completed_by``; None: its own record), and whether its fault record's line is that call's."""

    call: Candidate
    fault_line: bool

    @property
    def completed_by(self) -> int | None:
        return self.call.completed_by

    def to_dict(self) -> dict[str, Any]:
        return {**self.call.__dict__, "fault_line": self.fault_line}


def died_in(peers: list[Candidate], own: Candidate | None, fault: dict[str, Any] | None) -> DiedIn | None:
    """The call a rank that ended without a final dump was last in (see the module docstring):
    among the calls its peers' records show it issued after its own record stops (``peers``), the
    one at its fault record's line, else the latest (by step); without those, its own last call
    where its fault record's line is that call's. None where nothing says more than its record."""
    line = fault_line(fault) if fault is not None else None
    if peers:
        at_line = [c for c in peers if line is not None and c.source == line]
        if at_line:
            return DiedIn(at_line[-1], True)
        latest = max(peers, key=lambda c: (-1 if c.step is None else c.step, -1 if c.seq is None else c.seq))
        return DiedIn(latest, False)
    if own is not None and line is not None and own.source == line:
        return DiedIn(own, True)
    return None
