"""Which ranks and steps of a folder to read: ``--ranks 0-7,512`` and ``--steps 10-12``, and the
folder's ranks read one at a time with only the chosen ones loaded.

A selection is a set of whole numbers written as comma-separated numbers and inclusive ranges.
Files are picked by the rank their name ends in (``rank512.json``), before they are read, so a
trace of 8 ranks out of 1,024 reads 8 files; a file whose dump names another rank than its file
name is then judged by the rank inside it.

>>> Selection.parse("0-7,512", "--ranks").describe()
'0-7,512'
>>> 5 in Selection.parse("0-7,512", "--ranks")
True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from commdebug.errors import CommDebugError, DumpError
from commdebug.formats.folders import Dumps, dump_files, rank_from_name
from commdebug.formats.readers import read_all
from commdebug.model.rank_view import RankView

__all__ = ["SelectionError", "Selection", "ALL", "selections", "dump_files", "pick", "read_views", "iter_selected",
           "keep_steps"]

_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
# a selection wider than this is refused rather than expanded: nobody has 10 million ranks
_LARGEST = 10_000_000


class SelectionError(CommDebugError):
    """A ``--ranks`` or ``--steps`` value that is not a list of numbers and ranges (exit 2)."""


@dataclass(frozen=True)
class Selection:
    """A set of whole numbers as sorted, disjoint inclusive ranges; ``None`` ranges: everything."""

    ranges: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def parse(cls, text: str | None, option: str) -> Selection:
        """``"0-7,512"`` -> the numbers 0 to 7 and 512; None or empty -> everything. Raises
        :class:`SelectionError` naming `option` and the bad part."""
        if text is None:
            return ALL
        parts = [p for p in text.split(",")]
        if not text.strip() or any(not p.strip() for p in parts):
            raise SelectionError(f"{option}: expected numbers and ranges like 0-7,512, not {text!r}")
        ranges = []
        for part in parts:
            m = _PART.match(part)
            if not m:
                raise SelectionError(f"{option}: {part.strip()!r} is not a number >= 0 or a range like 0-7 (in {text!r})")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            if hi < lo:
                raise SelectionError(f"{option}: range {part.strip()!r} ends before it starts (write {hi}-{lo})")
            if hi > _LARGEST:
                raise SelectionError(f"{option}: {hi} is out of range (at most {_LARGEST})")
            ranges.append((lo, hi))
        ranges.sort()
        merged: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return cls(tuple(merged))

    @property
    def everything(self) -> bool:
        return self.ranges is None

    def __contains__(self, value: object) -> bool:
        if self.ranges is None:
            return True
        return isinstance(value, int) and any(lo <= value <= hi for lo, hi in self.ranges)

    def describe(self) -> str:
        """The selection as the option would write it: ``0-7,512``; ``all`` for everything."""
        if self.ranges is None:
            return "all"
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)


ALL = Selection()


def selections(ranks: str | None, steps: str | None) -> tuple[Selection, Selection]:
    """The ``--ranks`` and ``--steps`` options' selections (None: everything)."""
    return Selection.parse(ranks, "--ranks"), Selection.parse(steps, "--steps")


def pick(files: list[Path], ranks: Selection) -> list[Path]:
    """The files whose name ends in a rank of `ranks` (a name without a number is kept: the
    rank inside the dump decides, once it is read). None of them: a :class:`SelectionError`."""
    if ranks.everything:
        return list(files)
    kept = []
    for f in files:
        try:
            rank = rank_from_name(f)
        except DumpError:
            rank = None
        if rank is None or rank in ranks:
            kept.append(f)
    if files and not kept:
        where = files[0].parent if len(files) > 1 else files[0]
        raise SelectionError(f"{where}: no rank in --ranks {ranks.describe()} (it holds {len(files)} rank dump{'s' if len(files) != 1 else ''})")
    return kept


def read_views(files: list[Path], ranks: Selection = ALL, steps: Selection = ALL,
               progress: Callable[[int, int], None] | None = None, jobs: int | None = 1,
               digest: Callable[[RankView], Any] | None = None) -> Iterator[Any]:
    """Each file as a :class:`RankView`, in file order, when its rank is in `ranks`, its events
    cut to `steps`; ``jobs`` processes read them (None: as many as pay, see
    :func:`~commdebug.formats.readers.read_all`). ``digest``: a module-level function of the
    view, run where it was read, whose result is given instead (see ``read_all``).
    ``progress(done, total)`` is called before the first file and after each one."""
    total = len(files)
    if progress:
        progress(0, total)
    pick_digest = None if digest is None else partial(_selected, ranks=ranks, steps=steps, digest=digest)
    for done, (_, view) in enumerate(read_all(files, "rank", jobs=jobs, digest=pick_digest), 1):
        if isinstance(view, DumpError):
            raise view
        if digest is not None:
            if view is not None:
                yield view
        elif view.rank in ranks:
            yield keep_steps(view, steps)
        if progress:
            progress(done, total)


def _selected(view: RankView, ranks: Selection, steps: Selection, digest: Callable[[RankView], Any]) -> Any:
    """`digest` of the view cut to `steps`, or None when its rank is not in `ranks`."""
    return digest(keep_steps(view, steps)) if view.rank in ranks else None


def iter_selected(path: Dumps, ranks: Selection = ALL, steps: Selection = ALL,
                  progress: Callable[[int, int], None] | None = None, jobs: int | None = 1,
                  digest: Callable[[RankView], Any] | None = None) -> Iterator[Any]:
    """Each chosen rank of `path` (a folder, several, or one dump): :func:`read_views` of the files
    :func:`pick` keeps (or their `digest`).

    >>> for view in iter_selected("traces/", Selection.parse("0-7", "--ranks")):   # doctest: +SKIP
    ...     print(view.rank)
    """
    return read_views(pick(dump_files(path), ranks), ranks, steps, progress, jobs, digest)


def keep_steps(view: RankView, steps: Selection) -> RankView:
    """`view` with only the events of `steps` (the same view when every step is kept)."""
    if steps.everything:
        return view
    view.events = [e for e in view.events if e.step in steps]
    return view
