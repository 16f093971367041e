"""A folder of ranks by module: the union of the ranks' module trees, and each rank's calls per
phase, bytes and timed seconds per module (descendants included), with ``check``'s verdict.

What the viewer's folder page shows; computed here, worded there. Files are read one at a time,
and a rank's numbers are kept as tuples shared between ranks that agree (ranks of one job
usually do), so a thousand ranks cost little more than the distinct shapes among them.

>>> folder = rank_modules("traces/")            # doctest: +SKIP
>>> folder.tree.fqns[:2], folder.ranks[0].counts[:4]   # doctest: +SKIP
(['Global', 'Global.layers'], (4, 4, 0, 0))
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from commdebug.analysis.check import CheckResult, check
from commdebug.errors import DumpError
from commdebug.formats.readers import job_files, rank_from_name, read
from commdebug.model.rank_view import RankView
from commdebug.model.trace import GLOBAL, PHASES, Trace

__all__ = ["ModuleTree", "RankModules", "FolderModules", "rank_modules"]


@dataclass
class ModuleTree:
    """The union of the ranks' module trees, in first-seen order (a parent before its children)."""

    fqns: list[str] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index into fqns; -1 for the root
    types: list[str] = field(default_factory=list)  # module type of each fqn
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def add(self, fqn: str, parent: str | None, module_type: str) -> int:
        i = self._index.get(fqn)
        if i is None:
            i = self._index[fqn] = len(self.fqns)
            self.fqns.append(fqn)
            self.parents.append(-1 if parent is None else self._index[parent])
            self.types.append(module_type)
        return i

    def index(self, fqn: str) -> int:
        return self._index[fqn]


@dataclass
class RankModules:
    """One rank's file and, when it has a module tree, its numbers per module of the tree.

    ``counts`` holds four values per module (``PHASES`` order), ``bytes`` and ``seconds`` one;
    each indexed like the tree's modules known when the rank was read (shorter than the final
    tree: the modules after it were not in this rank), None where the rank lacks the module.
    """

    rank: int
    file: str
    format: str  # "commdebug" or "flight-recorder"
    metadata: dict[str, Any]
    events: int
    notes: list[str]
    has_tree: bool
    collectives: int | None = None
    total_bytes: int | None = None  # None: the dump recorded no bytes (torch's format)
    total_seconds: float | None = None  # None: untimed
    counts: tuple[int | None, ...] | None = None
    bytes: tuple[int | None, ...] | None = None
    seconds: tuple[float | None, ...] | None = None


@dataclass
class FolderModules:
    """:func:`rank_modules`'s result."""

    folder: Path
    tree: ModuleTree
    ranks: list[RankModules]  # in rank order
    check: CheckResult
    errors: list[str]  # one message per file that could not be read


def rank_modules(folder: str | os.PathLike) -> FolderModules:
    """Read every rank of `folder` (see :func:`commdebug.formats.readers.job_files`; a folder
    mixing two runs is refused) into per-module numbers, and check the ranks against each other.

    A file that cannot be read is left out and named in ``errors``; Flight Recorder files count
    for the check but have no module tree. Raises :class:`DumpError` when no readable rank has
    a tree.
    """
    root = Path(folder)
    tree = ModuleTree()
    ranks: list[RankModules] = []
    errors: list[str] = []
    shared: dict[tuple, tuple] = {}  # equal tuples stored once

    def one(values: list) -> tuple:
        t = tuple(values)
        return shared.setdefault(t, t)

    def views() -> Iterator[RankView]:
        for path in job_files(root):
            try:
                data = read(path)
            except DumpError as e:
                errors.append(str(e))
                continue
            if isinstance(data, RankView):
                ranks.append(RankModules(data.rank, path.name, data.source_format, data.metadata, len(data.events),
                                         list(data.notes), has_tree=False))
                yield data
                continue
            numbers = _numbers(data, path, tree, one)
            ranks.append(numbers)
            yield RankView(numbers.rank, path, dict(data.metadata), dict(data.groups), list(data.events), notes=numbers.notes)

    result = check(views())
    if not any(r.has_tree for r in ranks):
        if errors:  # nothing to show: the reason is the files that could not be read
            more = f" (and {len(errors) - 1} more file{'s' if len(errors) > 2 else ''} not read)" if len(errors) > 1 else ""
            raise DumpError(f"{errors[0]}{more}")
        raise DumpError(f"{root}: no rank dump here has a module tree (commdebug dumps do)")
    ranks.sort(key=lambda r: r.rank)
    return FolderModules(root, tree, ranks, result, errors)


def _numbers(trace: Trace, path: Path, tree: ModuleTree, one: Any) -> RankModules:
    rank = trace.metadata.get("rank")
    if not isinstance(rank, int):
        try:
            rank = rank_from_name(path)
        except DumpError:
            rank = -1
    present = [tree.add(fqn, trace.modules[fqn].parent, trace.modules[fqn].module_type) for fqn, _ in trace.walk()]
    n = len(tree.fqns)
    counts: list[int | None] = [None] * (len(PHASES) * n)
    nbytes: list[int | None] = [None] * n
    for fqn, _ in trace.walk():
        i = tree.index(fqn)
        total = 0
        for k, phase in enumerate(PHASES):
            c, b = trace.phase_totals(fqn, phase)
            counts[len(PHASES) * i + k] = c
            total += b
        nbytes[i] = total if trace.bytes_recorded else None
    seconds: list[float | None] | None = None
    if any(e.latency_s for e in trace.events):
        acc = [0.0] * n
        for e in trace.events:
            if not e.latency_s or not math.isfinite(e.latency_s):  # untimed, NaN or infinite
                continue
            fqn: str | None = e.module if e.module in trace.modules else GLOBAL
            while fqn is not None:  # descendants included, like the counts
                acc[tree.index(fqn)] += e.latency_s
                fqn = trace.modules[fqn].parent
        seconds = [None] * n
        for i in present:
            seconds[i] = float(f"{acc[i]:.4g}")
    totals = trace.totals()
    notes = []
    if trace.events_dropped:
        notes.append(f"{trace.events_dropped} older events were dropped (max_events): times cover the rest")
    return RankModules(
        rank, path.name, "commdebug", dict(trace.metadata), len(trace.events), notes, has_tree=True,
        collectives=totals["collectives"], total_bytes=totals["bytes"] if trace.bytes_recorded else None,
        total_seconds=None if seconds is None else seconds[tree.index(GLOBAL)],
        counts=one(counts), bytes=one(nbytes), seconds=None if seconds is None else one(seconds),
    )
