"""``commdebug diff`` as text: one line per module, phase and collective that changed."""

from __future__ import annotations

from typing import Sequence

from commdebug.analysis.diff import Change
from commdebug.units import format_bytes

__all__ = ["render_diff"]


def render_diff(changes: Sequence[Change], a: str, b: str) -> str:
    """The differences between dumps (or folders) `a` and `b` as text, ending with a newline.

    >>> print(render_diff(diff_traces(before, after), "before.json", "after.json"))  # doctest: +SKIP
    """
    lines: list[str] = []
    n = len(changes)
    for c in changes:
        where = f"rank {c.rank}: " if c.rank is not None else ""
        calls = f"{c.calls[0]} -> {c.calls[1]} calls"
        size = f", {format_bytes(c.bytes[0])} -> {format_bytes(c.bytes[1])}" if c.bytes[0] != c.bytes[1] else ""
        lines.append(f"{where}{c.module} [{c.phase}] {c.key} on {c.group}: {calls}{size}")
    head = f"no differences between {a} and {b}" if n == 0 else f"{n} difference{'s' if n != 1 else ''} between {a} (a) and {b} (b):"
    return "\n".join([head, *lines]) + "\n"
