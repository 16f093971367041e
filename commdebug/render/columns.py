"""Aligned text columns, the one layout every text table of the CLI uses: words to the left,
figures to the right, so that digits line up and trailing spaces never end a line."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["align"]


def align(rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """The rows as lines, each column as wide as its widest cell, two spaces apart; the first
    ``left`` columns flush left, the others flush right. Rows may be shorter than the longest.

    >>> align([["op", "calls"], ["all_reduce", "12"]])
    ['op          calls', 'all_reduce     12']
    """
    if not rows:
        return []
    widths = [0] * max(len(r) for r in rows)
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))).rstrip()
            for r in rows]
