"""``commdebug diff`` as text: one line per module, phase and collective that changed, one per
group whose calls were issued in another order, and a note per rank whose process ended
otherwise in one run than in the other."""

from __future__ import annotations

from collections.abc import Iterable

from commdebug.analysis.diff import Diff
from commdebug.render.endings import error_line
from commdebug.units import format_bytes

__all__ = ["render_diff"]


def render_diff(found: Diff | Iterable[Diff], a: str, b: str) -> str:
    """The differences between dumps (or folders) `a` and `b` as text, ending with a newline.

    >>> print(render_diff(diff_traces(before, after), "before.json", "after.json"))  # doctest: +SKIP
    """
    diffs = [found] if isinstance(found, Diff) else list(found)
    lines: list[str] = []
    for d in diffs:
        for c in d.changes:
            where = f"rank {c.rank}: " if c.rank is not None else ""
            calls = f"{c.calls[0]} -> {c.calls[1]} calls"
            size = f", {format_bytes(c.bytes[0])} -> {format_bytes(c.bytes[1])}" if c.bytes[0] != c.bytes[1] else ""
            on = f" on {c.group}" if c.group else ""
            lines.append(f"{where}{c.module} [{c.phase}] {c.key}{on}: {calls}{size}")
        for r in d.reorders:
            where = f"rank {r.rank}: " if r.rank is not None else ""
            on = f"group {r.group}" if r.group else "the calls"
            lines.append(f"{where}order changed on {on}: call {r.position} is {_call(r.a)} in a, {_call(r.b)} in b")
    n = len(lines)
    head = f"no differences between {a} and {b}" if n == 0 else f"{n} difference{'s' if n != 1 else ''} between {a} (a) and {b} (b):"
    rolled = sum(d.rolled_up for d in diffs)
    tail = [f"note: {rolled} module(s) present on one side only (inside a compiled block, say) are counted at their nearest module both sides have"] if rolled else []
    tail += [f"note: {f'rank {d.rank}' if d.rank is not None else 'the process'} ended by {error_line(d.ended[0], 120)} in a, "
             f"by {error_line(d.ended[1], 120)} in b" for d in diffs if d.ended is not None]
    return "\n".join([head, *lines, *tail]) + "\n"


def _call(text: str) -> str:
    op, _, nbytes = text.partition(" ")
    return f"{op} ({format_bytes(int(nbytes))})" if nbytes.isdigit() else text
