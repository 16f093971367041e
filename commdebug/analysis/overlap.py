"""Exposed communication: how much of each rank's communication ran under compute, and how
much the rank sat waiting for it (``commdebug overlap``), per rank and per op, step, group,
module, phase or source line. Data only; the wording is :mod:`commdebug.render.overlap`'s.

Definitions (docs/overlap.md), on one rank's :class:`~commdebug.model.profile.Profile`:

- communication and compute are each merged into a union of intervals; ``overlap_s`` is the
  length of their intersection, ``exposed_s = comm_s - overlap_s``, ``overlap_ratio =
  overlap_s / comm_s`` (HolisticTraceAnalysis's comp_comm_overlap, as a ratio);
- the whole-rank figures cover what HTA 0.5.0's cover by default: with two or more
  ``ProfilerStep`` spans, only the activities launched before the last step begins (the last is
  usually cut short); a step row covers the activities launched in that step (before the first
  step: in the first), the one outside HTA's window marked so;
- a row's ``comm_s`` is the union of its collectives' kernels (or gloo spans), ``overlap_s`` the
  part of it under compute; its ``exposed_s`` is its share of the rank's exposed time: an instant
  when several communication activities run and no compute does is split equally among them, so
  the rows of one grouping (but ``step``) add up to the rank's exposed time over the same window;
- ``--round-us``: times rounded inward to whole microseconds as HTA 0.5.0 does when a trace has
  sub-microsecond digits (start up, end down), to reproduce its figure exactly;
- exposed time split into waiting for a late peer and the transfer (``exposed_wait_s``,
  ``exposed_transfer_s``), where every member of each call is timed in the folder: made when the
  ranks are merged, from each call's least length over its members
  (:mod:`commdebug.analysis.overlap_wait`).

Each rank is reduced to its figures where it is read (:func:`rank_overlap`, run in ``-j``'s
worker processes), so a folder of large traces is never in memory at once.

    >>> result = overlap_path("traces/", by="module")       # doctest: +SKIP
    >>> result.ranks[0].exposed_s
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from commdebug.analysis.overlap_wait import CallKey, CallTimes, Pieces, WaitInputs, least_lengths, split
from commdebug.errors import CommDebugError, DumpError
from commdebug.model.profile import Activities, Profile
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent

if TYPE_CHECKING:
    from commdebug.formats.folders import Dumps

__all__ = ["BY", "RankOverlap", "OverlapRow", "Overlap", "RankShare", "rank_overlap", "overlap", "overlap_path",
           "step_rows", "call_times", "split_waits", "union", "intersection_length"]

# the key of communication the trace ties to no collective (a word: "?" stands for a value not known)
UNATTRIBUTED = "unattributed"
# grouping -> (needs the joined dump, key of one call)
BY: dict[str, tuple[bool, Callable[[CollectiveEvent], Any]]] = {
    "op": (False, lambda e: e.op),
    "group": (False, lambda e: e.group.label),
    "phase": (False, lambda e: e.phase),
    "module": (True, lambda e: e.module),
    "line": (True, lambda e: e.source or UNATTRIBUTED),
    "step": (False, lambda e: e.step),
    # the FSDP unit whose parameters the call moves (None: no unit's), not the module that issued it
    "unit": (True, lambda e: e.unit),
}


@dataclass
class RankOverlap:
    """One rank's whole figures, over HTA's window (see the module docstring)."""

    rank: int
    device: str  # "gpu": NCCL kernels against compute kernels; "cpu": gloo's spans against CPU ops
    comm_s: float
    compute_s: float
    overlap_s: float
    exposed_s: float
    calls: int  # collectives with communication in the window
    steps: list[int]  # the trace's ProfilerStep numbers
    window: str  # which activities the figures cover, in words
    joined: bool  # its calls are joined to the rank's commdebug dump (module, phase, line known)
    path: str = ""
    # exposed_s as waiting for a late peer and the rest (overlap_wait); None: not known
    exposed_wait_s: float | None = None
    exposed_transfer_s: float | None = None

    @property
    def overlap_ratio(self) -> float | None:
        return self.overlap_s / self.comm_s if self.comm_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overlap_ratio"] = self.overlap_ratio
        return d


@dataclass
class OverlapRow:
    """One rank's figures for one key of a grouping."""

    rank: int
    key: Any
    calls: int
    comm_s: float
    overlap_s: float
    exposed_s: float
    in_window: bool = True  # step rows: False for the step outside HTA's window
    compute_s: float | None = None  # step rows: the step's compute (union of its compute activities)
    exposed_wait_s: float | None = None  # exposed_s as waiting for a late peer and the rest; None: not known
    exposed_transfer_s: float | None = None

    @property
    def overlap_ratio(self) -> float | None:
        return self.overlap_s / self.comm_s if self.comm_s > 0 else None

    def to_dict(self, by: str) -> dict[str, Any]:
        d: dict[str, Any] = {"rank": self.rank, by: self.key, "calls": self.calls, "comm_s": self.comm_s,
                             "overlap_s": self.overlap_s, "exposed_s": self.exposed_s, "overlap_ratio": self.overlap_ratio,
                             "exposed_wait_s": self.exposed_wait_s, "exposed_transfer_s": self.exposed_transfer_s}
        if by == "step":
            d["in_window"] = self.in_window
            d["compute_s"] = self.compute_s
        return d


@dataclass
class RankShare:
    """What one rank contributes to an :class:`Overlap` (small, picklable: a worker's result)."""

    rank: int
    figures: RankOverlap | None
    rows: list[OverlapRow]
    notes: list[str]
    waits: WaitInputs | None = None  # what splitting its exposed time needs, until the ranks are merged


@dataclass
class Overlap:
    ranks: list[RankOverlap]
    by: str
    rows: list[OverlapRow]
    notes: list[str] = field(default_factory=list)
    without_profile: list[int] = field(default_factory=list)  # ranks read that have no profile

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": [r.to_dict() for r in self.ranks], "by": self.by, "rows": [r.to_dict(self.by) for r in self.rows],
                "notes": self.notes, "ranks_without_profile": self.without_profile}


# ---- intervals --------------------------------------------------------------------------------

def union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering exactly what ``spans`` cover.

    >>> union([(3, 4), (1, 2), (1.5, 2.5)])
    [(1, 2.5), (3, 4)]
    """
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The length of the intersection of two unions (each sorted and disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _length(spans: list[tuple[float, float]]) -> float:
    return math.fsum(e - s for s, e in spans)


def _inward(start: float, end: float) -> tuple[float, float]:
    return float(math.ceil(start)), float(math.floor(end))


def _spans(acts: Activities, keep: Callable[[int], bool], round_us: bool) -> list[tuple[float, float, int]]:
    """(start, end, ref) of the activities ``keep`` keeps, rounded inward with ``round_us``."""
    out = []
    for k, (s, e, _, ref) in enumerate(acts):
        if keep(k):
            if round_us:
                s, e = _inward(s, e)
            if e > s:
                out.append((s, e, ref))
    return out


def _sweep(comm: list[tuple[float, float, Any]], compute: list[tuple[float, float]],
           pieces: Pieces | None = None) -> tuple[float, float, float, dict[Any, list[float]]]:
    """(comm, overlap, exposed) over everything, and per key [comm, overlap, exposed share]:
    every instant is looked at once, between consecutive boundaries of any activity. `pieces`
    (keys: refs): each key's exposed instants, with its share of each."""
    points: list[tuple[float, int, Any]] = []
    for s, e, key in comm:
        points.append((s, 1, key))
        points.append((e, -1, key))
    for s, e in compute:  # a union: disjoint
        points.append((s, 2, None))
        points.append((e, -2, None))
    points.sort(key=lambda p: p[0])
    active: dict[Any, int] = {}
    n_active = 0
    covered = False
    total = over = exposed = 0.0
    per_key: dict[Any, list[float]] = {}
    prev = points[0][0] if points else 0.0
    for t, kind, key in points:
        length = t - prev
        if length > 0 and n_active:
            total += length
            if covered:
                over += length
            else:
                exposed += length
            for k, count in active.items():
                cell = per_key.get(k)
                if cell is None:
                    cell = per_key[k] = [0.0, 0.0, 0.0]
                cell[0] += length
                if covered:
                    cell[1] += length
                else:
                    cell[2] += length * count / n_active
                    if pieces is not None:
                        pieces.add(k, prev, t, count / n_active)
        prev = t
        if kind == 1:
            active[key] = active.get(key, 0) + 1
            n_active += 1
        elif kind == -1:
            left = active[key] - 1
            if left:
                active[key] = left
            else:
                del active[key]
            n_active -= 1
        else:
            covered = kind == 2
    return total, over, exposed, per_key


# ---- one rank ---------------------------------------------------------------------------------

def _call_key(profile: Profile, view: RankView, by: str) -> Callable[[int], Any]:
    """The row key of a communication activity's call (its ref): the joined dump event's field
    where the profile is joined, else the trace's own call's."""
    _, key_of = BY[by]
    joined = profile.joined
    calls = profile.calls

    def key(ref: int) -> Any:
        if ref < 0:
            return UNATTRIBUTED
        if joined is not None:
            j = joined[ref]
            if j >= 0:
                return key_of(view.events[j])
            return UNATTRIBUTED if BY[by][0] else key_of(calls[ref])
        return key_of(calls[ref])

    return key


def rank_overlap(view: RankView, by: str = "op", round_us: bool = False) -> RankShare:
    """One rank's :class:`RankShare`: its whole figures and its rows by ``by`` (see the module
    docstring); a rank without a profile gives none.

    >>> share = rank_overlap(load_rank("traces/rank0.pt.trace.json.gz"), by="op")   # doctest: +SKIP
    """
    profile = view.profile
    if profile is None:
        return RankShare(view.rank, None, [], [])
    # what joining said (the trace's own notes concern check and report, not the time)
    notes = [n for n in view.notes if n not in profile.notes]
    if not profile.calls and not len(profile.comm):
        notes.append("its trace has no collectives and no communication: nothing to measure")
    window_end = profile.window_end
    comm, compute = profile.comm, profile.compute

    def in_window(acts: Activities) -> Callable[[int], bool]:
        if window_end is None:
            return lambda k: True
        launch = acts.launch
        return lambda k: launch[k] < window_end  # NaN (launch not in the trace) compares False, as HTA drops it

    key_of = _call_key(profile, view, by if by != "step" else "op")
    comm_spans = _spans(comm, in_window(comm), round_us)
    compute_union = union((s, e) for s, e, _ in _spans(compute, in_window(compute), round_us))
    total_pieces = Pieces()
    total, over, exposed, per_ref = _sweep([(s, e, ref) for s, e, ref in comm_spans], compute_union, total_pieces)
    refs = {ref for _, _, ref in comm_spans if ref >= 0}
    window = ("everything in the trace" if window_end is None else
              f"activities launched before step {profile.steps[-1].number} began (HTA's window: the last step is left out)")
    figures = RankOverlap(view.rank, profile.device, total / 1e6, _length(compute_union) / 1e6, over / 1e6, exposed / 1e6,
                          len(refs), [s.number for s in profile.steps], window, profile.joined is not None, str(profile.path))
    row_pieces: list[Pieces] = []
    if by == "step":
        rows = step_rows(view.rank, profile, round_us, row_pieces)
    else:
        by_key: dict[Any, list[float]] = {}
        calls_of: dict[Any, set[int]] = {}
        for ref, (_, _, x) in per_ref.items():
            k = key_of(ref)
            cell = by_key.setdefault(k, [0.0, 0.0, 0.0])
            cell[2] += x
            if ref >= 0:
                calls_of.setdefault(k, set()).add(ref)
        # a key's comm and overlap are the union of its own activities (not the sum of its calls')
        for k in by_key:
            mine = union((s, e) for s, e, ref in comm_spans if key_of(ref) == k)
            by_key[k][0] = _length(mine)
            by_key[k][1] = intersection_length(mine, compute_union)
        rows = [OverlapRow(view.rank, k, len(calls_of.get(k, ())), c / 1e6, o / 1e6, x / 1e6) for k, (c, o, x) in by_key.items()]
        rows.sort(key=lambda r: (-r.exposed_s, -r.comm_s, str(r.key)))
        refs_of: dict[Any, list[int]] = {}
        for ref in total_pieces:
            refs_of.setdefault(key_of(ref), []).append(ref)
        row_pieces = [Pieces((ref, total_pieces[ref]) for ref in refs_of.get(r.key, ())) for r in rows]
    waits = WaitInputs(call_times(profile, view.events, round_us), total_pieces, row_pieces)
    return RankShare(view.rank, figures, rows, notes, waits)


def call_times(profile: Profile, events: Sequence[CollectiveEvent], round_us: bool = False) -> CallTimes:
    """Each of the profile's calls (by its index) as the wait split pairs them across ranks: its
    (group name, sequence number) and group size, from the joined dump event where there is one,
    (`events`: the rank's dump's) else the trace's own call (None where it names no group or
    number), and its span: from its
    first communication activity's start to its last one's end, all of them, in or out of HTA's
    window (rounded inward with `round_us`, as the sweep's)."""
    n = len(profile.calls)
    out = CallTimes()
    start, end = [math.inf] * n, [-math.inf] * n
    for s, e, ref in _spans(profile.comm, lambda k: True, round_us):
        if 0 <= ref < n:
            start[ref] = min(start[ref], s)
            end[ref] = max(end[ref], e)
    joined = profile.joined
    for ref, call in enumerate(profile.calls):
        j = joined[ref] if joined is not None else -1
        event = events[j] if j >= 0 else call
        known = event.group.name != "?" and event.seq is not None and end[ref] > start[ref]
        out.keys.append((event.group.name, event.seq) if known else None)  # type: ignore[arg-type]  # known: seq is an int
        out.sizes.append(event.group.size)
        out.start.append(start[ref] if known else 0.0)
        out.length.append(end[ref] - start[ref] if known else 0.0)
    return out


def step_rows(rank: int, profile: Profile, round_us: bool = False, pieces: list[Pieces] | None = None) -> list[OverlapRow]:
    """Each ProfilerStep's own figures: the activities launched in it (the folder page's chart
    shows them per rank and step). `pieces`: each step's exposed pieces per call are appended to
    it, in the rows' order (what splitting the exposed time needs: :func:`split_waits`).

    >>> [(r.key, r.exposed_s) for r in step_rows(0, view.profile)]   # doctest: +SKIP
    [(4, 0.0102), (5, 0.0105), (6, 0.0189)]
    """
    if not profile.steps:
        return []
    window_end = profile.window_end
    comm_step = [profile.step_of(t if not math.isnan(t) else s) for s, _, t, _ in profile.comm]
    compute_step = [profile.step_of(t if not math.isnan(t) else s) for s, _, t, _ in profile.compute]
    rows = []
    for step in profile.steps:
        number = step.number
        comm_spans = _spans(profile.comm, partial(_is_step, comm_step, number), round_us)
        compute_union = union((s, e) for s, e, _ in _spans(profile.compute, partial(_is_step, compute_step, number), round_us))
        mine = Pieces()
        total, over, exposed, _ = _sweep(comm_spans, compute_union, mine)
        if pieces is not None:
            pieces.append(mine)
        calls = len({ref for _, _, ref in comm_spans if ref >= 0})
        rows.append(OverlapRow(rank, number, calls, total / 1e6, over / 1e6, exposed / 1e6,
                               in_window=window_end is None or step.start < window_end,
                               compute_s=_length(compute_union) / 1e6))
    return rows


def _is_step(steps: list[int | None], number: int, k: int) -> bool:
    return steps[k] == number


# ---- many ranks -------------------------------------------------------------------------------

def overlap(shares: Iterable[RankShare], by: str = "op") -> Overlap:
    """The ranks' shares as one result, in rank order; notes said once with their ranks."""
    from commdebug.analysis.findings import who

    ranks, rows, without = [], [], []
    notes: dict[str, list[int]] = {}
    waits: list[tuple[RankOverlap | None, list[OverlapRow], WaitInputs]] = []
    for share in shares:
        if share.figures is None:
            without.append(share.rank)
            continue
        ranks.append(share.figures)
        rows.extend(share.rows)
        if share.waits is not None:
            waits.append((share.figures, share.rows, share.waits))
        for n in share.notes:
            notes.setdefault(n, []).append(share.rank)
    split_waits(waits)
    ranks.sort(key=lambda r: r.rank)
    rows.sort(key=lambda r: r.rank)  # stable: each rank's own order kept
    return Overlap(ranks, by, rows, [f"{who(rs)}: {n}" for n, rs in notes.items()], sorted(without))


def split_waits(ranks: list[tuple[RankOverlap | None, list[OverlapRow], WaitInputs]],
                least: dict[CallKey, tuple[float, int, int]] | None = None) -> None:
    """Fill ``exposed_wait_s`` and ``exposed_transfer_s`` of each rank's figures (where given) and
    rows, from every rank's calls (:mod:`commdebug.analysis.overlap_wait`; `least`: their least
    lengths where the caller has them, else those of `ranks`); the inputs are then emptied."""
    if least is None:
        least = least_lengths(w.calls for _, _, w in ranks)
    for figures, rows, w in ranks:
        total, per_row = split(w, least)
        if figures is not None and total is not None:
            figures.exposed_wait_s, figures.exposed_transfer_s = total, max(figures.exposed_s - total, 0.0)
        for row, wait in zip(rows, per_row, strict=True):
            if wait is not None:
                row.exposed_wait_s, row.exposed_transfer_s = wait, max(row.exposed_s - wait, 0.0)
        w.total.clear()
        w.rows.clear()


def check_by(by: str) -> str:
    """``by`` if it is a grouping, else a clear error."""
    by = by.strip()
    if by not in BY:
        raise CommDebugError(f"unknown overlap grouping {by!r} (choose from: {', '.join(BY)})")
    return by


def overlap_path(path: Dumps, by: str = "op", *, round_us: bool = False, jobs: int | None = 1,
                 progress: Callable[[int, int], None] | None = None) -> Overlap:
    """:func:`overlap` over one trace, one dump with its profile, or a folder of them (a folder
    of per-node folders, or several folders)."""
    from commdebug.formats.folders import dumps_name
    from commdebug.formats.selection import iter_selected

    by = check_by(by)
    result = overlap(iter_selected(path, progress=progress, jobs=jobs, digest=partial(rank_overlap, by=by, round_us=round_us)), by)
    if not result.ranks:
        raise DumpError(f"{dumps_name(path)}: no profile to measure: give torch.profiler traces (one per rank), or record with "
                        "`commdebug run --profile-steps A-B`, which writes rank<R>.profile.json.gz beside each dump")
    if BY[by][0] and not any(r.joined for r in result.ranks):
        raise CommDebugError(f"--by {by} needs each profile joined to its rank's commdebug dump (the trace alone knows no "
                             f"{by}s): record with `commdebug run --profile-steps A-B --out DIR` and run overlap on DIR")
    return result
