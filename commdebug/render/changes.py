"""``commdebug diff`` as text: one line per module, phase and collective that changed."""

from __future__ import annotations

from typing import Iterable

from commdebug.analysis.diff import Change
from commdebug.units import format_bytes

__all__ = ["render_changes"]


def render_changes(changes: Iterable[Change], a: str, b: str) -> tuple[str, int]:
    """The differences as text (ending with a newline) and how many there are."""
    lines: list[str] = []
    n = 0
    for c in changes:
        n += 1
        where = f"rank {c.rank}: " if c.rank is not None else ""
        calls = f"{c.calls[0]} -> {c.calls[1]} calls"
        size = f", {format_bytes(c.bytes[0])} -> {format_bytes(c.bytes[1])}" if c.bytes[0] != c.bytes[1] else ""
        lines.append(f"{where}{c.module} [{c.phase}] {c.key} on {c.group}: {calls}{size}")
    head = f"no differences between {a} and {b}" if n == 0 else f"{n} difference{'s' if n != 1 else ''} between {a} (a) and {b} (b):"
    return "\n".join([head, *lines]) + "\n", n
