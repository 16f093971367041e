"""A folder of ranks by module: the union of the ranks' module trees, and each rank's calls per
phase, bytes and timed seconds per module (descendants included), with ``check``'s verdict.

What the viewer's folder page shows; computed here, worded there. Files are read one at a time,
and a rank's numbers are kept as tuples shared between ranks that agree (ranks of one job
usually do), so a thousand ranks cost little more than the distinct shapes among them.

Each rank also gets its calls, bytes and timed seconds per (step, op): the page's rank x step
heatmap, the spread of each op across ranks, and what one cell of the heatmap holds. Seconds are
exact: each the correctly rounded sum of its latencies (:func:`math.fsum`), never rounded for
the page's size, so a figure the page adds up and rounds once reads as ``report`` prints it. When some
rank has all_to_all or send/recv calls, the traffic between ranks (``traffic_path``'s, per
step) is tallied in the same read.

>>> folder = rank_modules("traces/")            # doctest: +SKIP
>>> folder.tree.fqns[:2], folder.ranks[0].counts[:4]   # doctest: +SKIP
(['Global', 'Global.layers'], (4, 4, 0, 0))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.analysis.check import CheckResult, check
from commdebug.analysis.check_digest import process_alive
from commdebug.analysis.overlap import OverlapRow, call_times, split_waits, step_rows
from commdebug.analysis.overlap_wait import CallTimes, Pieces, WaitInputs, least_lengths
from commdebug.analysis.traffic import ImbalanceTally, PeerTally, Traffic
from commdebug.errors import DumpError
from commdebug.formats.folders import Dumps, common_folder, find_job, rank_from_name
from commdebug.formats.readers import read_all
from commdebug.formats.selection import ALL, Selection
from commdebug.model.fault import ending_note
from commdebug.model.rank_view import RankView
from commdebug.model.trace import GLOBAL, PHASES, Trace, known_bytes

__all__ = ["ModuleTree", "StepOps", "RankModules", "FolderModules", "rank_modules", "step_ops"]


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
class StepOps:
    """One rank's calls, bytes and timed seconds per (step, op), in (step, op) order: column
    tuples of one value per key. ``seconds`` is None for an untimed rank, and holds None where
    no call of that key was timed; ``bytes`` holds None where no call's size is known."""

    keys: tuple[tuple[int, str], ...]
    calls: tuple[int, ...]
    bytes: tuple[int | None, ...]
    seconds: tuple[float | None, ...] | None  # exact sums (math.fsum) of the latencies


def step_ops(events: Iterable[Any], steps: Selection = ALL, one: Callable[[list], tuple] = tuple) -> StepOps:
    """:class:`StepOps` of a rank's events, those of `steps` only; `one` makes each column a
    tuple (:func:`rank_modules` passes one that shares equal tuples between ranks).

    >>> step_ops(trace.events).seconds[:2]      # doctest: +SKIP
    (0.023324865, 0.0011805)
    """
    acc: dict[tuple[int, str], list] = {}
    timed = False
    for e in events:
        if not steps.everything and e.step not in steps:
            continue
        key = (e.step, e.op)
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0, 0, [], 0]
        a[0] += 1
        if e.size_bytes is None:  # not known: counted apart, never as 0 bytes
            a[3] += 1
        else:
            a[1] += e.size_bytes
        lat = e.latency_s
        if lat is not None and math.isfinite(lat):  # untimed, NaN or infinite: no time
            a[2].append(lat)
            timed = True
    keys = sorted(acc)
    rows = [acc[k] for k in keys]
    seconds = one([math.fsum(r[2]) if r[2] else None for r in rows]) if timed else None
    return StepOps(one(keys), one([r[0] for r in rows]), one([known_bytes(r[1], r[3], r[0]) for r in rows]), seconds)


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
    step_ops: StepOps | None = None  # per (step, op); Flight Recorder ranks have them too
    # per profiled step (a profile beside the dump, or a profiler trace): compute, overlapped and
    # exposed communication, the exposed time split into waiting and transfer where every member
    # of its calls was profiled (commdebug.analysis.overlap.step_rows); None without a profile
    overlap: list[OverlapRow] | None = None
    overlap_waits: WaitInputs | None = None  # what that split needs, until every rank is read


@dataclass
class FolderModules:
    """:func:`rank_modules`'s result."""

    folder: Path
    tree: ModuleTree
    ranks: list[RankModules]  # in rank order
    check: CheckResult
    errors: list[str]  # one message per file that could not be read
    ranks_chosen: str = "all"  # the --ranks the numbers are of (the check covers every rank)
    steps_chosen: str = "all"  # the --steps the per-(step, op) numbers are of
    ranks_left_out: int = 0  # ranks read for the check only
    # what ``commdebug.traffic_path(folder, by_step=True)`` gives, of the ranks and steps chosen;
    # None when none of them has an all_to_all or send/recv call
    traffic: Traffic | None = None

    def steps(self) -> list[int]:
        """Every step some rank has a call in (within the steps chosen), in order."""
        return sorted({k[0] for r in self.ranks if r.step_ops for k in set(r.step_ops.keys)})

    def ops(self) -> list[str]:
        """Every op some rank issued, most calls first."""
        calls: dict[str, int] = {}
        for r in self.ranks:
            if r.step_ops:
                for (_, op), c in zip(r.step_ops.keys, r.step_ops.calls, strict=True):
                    calls[op] = calls.get(op, 0) + c
        return sorted(calls, key=lambda op: (-calls[op], op))


def rank_modules(folder: Dumps, *, ranks: Selection = ALL, steps: Selection = ALL,
                 progress: Callable[[int, int], None] | None = None, jobs: int | None = 1) -> FolderModules:
    """Read every rank of `folder` (see :func:`commdebug.formats.folders.find_job`: a folder of
    per-node folders, or several folders, are one job; a folder mixing two runs is refused) into per-module and per-(step, op) numbers, and check the ranks
    against each other.

    A file that cannot be read is left out and named in ``errors``; Flight Recorder files count
    for the check but have no module tree. Raises :class:`DumpError` when no readable rank has
    a tree. `ranks` keeps the numbers of those ranks only (the check still reads every rank: a
    subset would look like missing ranks); `steps` cuts the per-(step, op) numbers and the
    per-step ``overlap`` rows to those steps (the module numbers are the dumps' own, over every
    step). ``traffic``: the peer and
    all_to_all imbalance rows of the ranks and steps chosen (as ``traffic_path(folder,
    by_step=True)``), tallied from the events already read. ``progress(done, total)``
    is called before the first file and after each one. ``jobs``: processes reading the files
    (None: as many as pay; :func:`commdebug.formats.readers.read_all`).
    """
    job = find_job(folder)
    root = common_folder(folder)
    tree = ModuleTree()
    found: list[RankModules] = []
    errors: list[str] = []
    left_out = 0  # ranks read for the check only
    shared: dict[tuple, tuple] = {}  # equal tuples stored once
    peers: PeerTally | None = None  # made when a chosen rank has pair traffic
    a2a = ImbalanceTally()
    profiled: list[CallTimes] = []  # every profiled rank's calls, chosen or not: each call's least length is over all

    def one(values: list) -> tuple:
        t = tuple(values)
        return shared.setdefault(t, t)

    def tally(rank: int, events: list, ops: StepOps) -> None:
        nonlocal peers
        if not _PAIR_OPS.intersection(op for _, op in ops.keys):  # ops.keys are within `steps` already
            return
        if peers is None:
            peers = PeerTally(by_step=True)
        kept = events if steps.everything else [e for e in events if e.step in steps]
        peers.add(rank, kept)
        a2a.add(rank, kept)

    def views() -> Iterator[RankView]:
        nonlocal left_out
        files = job.files
        if progress:
            progress(0, len(files))
        for done, (path, data) in enumerate(read_all(files, "read", jobs=jobs), 1):
            if progress:
                progress(done, len(files))
            if isinstance(data, DumpError):
                errors.append(str(data))
                continue
            rank = data.rank if isinstance(data, RankView) else _rank_of(data, path)
            if rank not in ranks:
                left_out += 1
            else:
                ops = step_ops(data.events, steps, one)
                if isinstance(data, RankView):
                    found.append(RankModules(data.rank, path.name, data.source_format, data.metadata, len(data.events),
                                             list(data.notes), has_tree=False, step_ops=ops))
                else:
                    numbers = _numbers(data, path, tree, one)
                    numbers.step_ops = ops
                    if numbers.overlap is not None and not steps.everything:  # the page's per-step sections agree
                        waits = numbers.overlap_waits
                        if waits is not None:
                            waits.rows = [p for o, p in zip(numbers.overlap, waits.rows, strict=True) if o.key in steps]
                        numbers.overlap = [o for o in numbers.overlap if o.key in steps]
                    found.append(numbers)
                ending = ending_note(data.metadata, process_alive(data.metadata) if data.metadata.get("ended_by") in (None, "hang") else None)
                if ending is not None:  # a fatal signal, or no final dump: said on the page with the rank
                    found[-1].notes.append(ending)
                tally(rank, data.events, ops)
            if data.profile is not None:
                chosen = found[-1].overlap_waits if rank in ranks and found and found[-1].rank == rank else None
                profiled.append(chosen.calls if chosen is not None else call_times(data.profile, data.events))
            if isinstance(data, RankView):
                yield data
            else:
                # a trace read from a torch.profiler file says so: the check words what it lacks by its format
                source = "torch-profiler" if data.metadata.get("format") == "torch-profiler" else "commdebug"
                yield RankView(rank, path, dict(data.metadata), dict(data.groups), list(data.events), source_format=source,
                               notes=_notes(data))

    result = check(views(), job.scope)
    if not found and left_out:
        raise DumpError(f"{root}: no rank in --ranks {ranks.describe()} (the folder has {left_out} rank dump{'s' if left_out != 1 else ''})")
    if not any(r.has_tree for r in found):
        if errors:  # nothing to show: the reason is the files that could not be read
            more = f" (and {len(errors) - 1} more file{'s' if len(errors) > 2 else ''} not read)" if len(errors) > 1 else ""
            raise DumpError(f"{errors[0]}{more}")
        raise DumpError(f"{root}: no rank dump here has a module tree (commdebug dumps do)")
    found.sort(key=lambda r: r.rank)
    split_waits([(None, r.overlap, r.overlap_waits) for r in found if r.overlap is not None and r.overlap_waits is not None],
                least_lengths(profiled))
    for r in found:
        r.overlap_waits = None
    traffic = None if peers is None else Traffic(peers.rows(), a2a.rows())
    return FolderModules(root, tree, found, result, errors, ranks.describe(), steps.describe(), left_out, traffic)


_PAIR_OPS = {"all_to_all", "send", "recv"}  # the ops that move data between named pairs of ranks


def _rank_of(trace: Trace, path: Path) -> int:
    rank = trace.metadata.get("rank")
    if isinstance(rank, int):
        return rank
    try:
        return rank_from_name(path)
    except DumpError:
        return -1


def _notes(trace: Trace) -> list[str]:
    if trace.events_dropped:
        return [f"{trace.events_dropped} older events were dropped (max_events): times cover the rest"]
    return []


def _numbers(trace: Trace, path: Path, tree: ModuleTree, one: Any) -> RankModules:
    rank = _rank_of(trace, path)
    present = [tree.add(fqn, trace.modules[fqn].parent, trace.modules[fqn].module_type) for fqn, _ in trace.walk()]
    n = len(tree.fqns)
    counts: list[int | None] = [None] * (len(PHASES) * n)
    nbytes: list[int | None] = [None] * n
    for fqn, _ in trace.walk():
        i = tree.index(fqn)
        total = calls = unknown = 0
        for k, phase in enumerate(PHASES):
            c, b = trace.phase_totals(fqn, phase)
            counts[len(PHASES) * i + k] = c
            total += b or 0
            calls += c
            unknown += trace.unknown_sizes(fqn, phase)
        nbytes[i] = known_bytes(total, unknown, calls) if trace.bytes_recorded else None
    seconds: list[float | None] | None = None
    if any(e.latency_s for e in trace.events):
        acc: list[list[float]] = [[] for _ in range(n)]
        for e in trace.events:
            if not e.latency_s or not math.isfinite(e.latency_s):  # untimed, NaN or infinite
                continue
            at: str | None = e.module if e.module in trace.modules else GLOBAL
            while at is not None:  # descendants included, like the counts
                acc[tree.index(at)].append(e.latency_s)
                at = trace.modules[at].parent
        seconds = [None] * n
        for i in present:
            seconds[i] = math.fsum(acc[i])  # exact: the page rounds once, for display
    totals = trace.totals()
    notes = _notes(trace)
    numbers = RankModules(
        rank, path.name, str(trace.metadata.get("format") or "commdebug"), dict(trace.metadata), len(trace.events), notes, has_tree=True,
        collectives=totals["collectives"], total_bytes=totals["bytes"] if trace.bytes_recorded else None,
        total_seconds=None if seconds is None else seconds[tree.index(GLOBAL)],
        counts=one(counts), bytes=one(nbytes), seconds=None if seconds is None else one(seconds),
    )
    if trace.profile is not None:
        pieces: list[Pieces] = []
        numbers.overlap = step_rows(rank, trace.profile, pieces=pieces)
        numbers.overlap_waits = WaitInputs(call_times(trace.profile, trace.events), Pieces(), pieces)
    return numbers
