"""The job across ranks: ``commdebug report``.

- per rank: host, collectives, bytes, communication time (sum of latencies), elapsed and
  recorded time and the communication share; with min / median / max over ranks and which rank
  holds each, as mpitrace prints them;
- per op across all ranks: calls, bytes, time, algbw and busbw (bytes over time);
- straggler effect: for each call, its latency on a rank minus the least latency of the same
  call on any rank of its group, pairing calls by (process group, sequence number), summed per
  op and per rank. A rank that arrives late makes the others wait: their latencies hold the
  wait, its own does not, so a large straggler effect on a rank says it waited for others.
  Calls every member timed alike give exactly 0 (sums are exact, see :class:`_Stragglers`);
  where ``--ranks`` leaves out members of a group, the least latency is not known and neither
  is the straggler time (None);
- each rank's deviation: how far its figures lie from the median rank's, so a thousand ranks
  can be cut to the few worth reading (:meth:`Report.top`);
- each rank's worst steps: the steps where its communication time most exceeds the median
  rank's time at that step, and by how much (``worst_steps``), so a slow rank says when;
- all_to_all imbalance: per step and group, the received bytes' max over mean in the step's
  most uneven call, the rank that received most and its module (``all_to_all_imbalance``; see
  :class:`commdebug.analysis.traffic.Imbalance`). One rank's dump knows only its own receives;
- late ranks: per step, the ranks that arrived last at a call and made the others wait, the
  wait they caused, and what they did before they came (``late``; each rank's total in
  ``caused_wait_s``; see :mod:`commdebug.analysis.late`).

It streams in one pass over the dumps, and its memory does not grow with the number of ranks:
per rank it keeps its totals, its time per step (one float per step) and the spans of sequence
numbers it timed per group; per group, the least latency, rank count and op of each call in flat
arrays.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress
from math import fsum
from operator import and_ as _and, gt as _gt, mul as _mul
from typing import Any

from commdebug.analysis.check import who
from commdebug.analysis.check_digest import process_alive
from commdebug.analysis.late import GapOps, LateRanks, LateThreshold
from commdebug.analysis.late_digest import Known, LateDigest, late_digest, step_medians, step_times
from commdebug.analysis.late_tally import LateTally
from commdebug.analysis.shares import share_base
from commdebug.analysis.traffic import Imbalance, ImbalanceTally
from commdebug.formats.folders import Dumps, find_job
from commdebug.formats.selection import read_views
from commdebug.model.aggregates import older_of
from commdebug.model.columns import BUSBW, GROUP_NAME, IS_NOT_NONE, LATENCY, OP, SEQ, SIZE, STEP
from commdebug.model.fault import ending_note
from commdebug.model.presence import Absence, FolderScope, Placement, absence, placement_of
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo, known_bytes

__all__ = ["RankStats", "StepExcess", "OpStats", "Deviation", "Report", "RankDigest", "report", "report_path", "rank_digest", "DEVIATION_FIGURES",
           "WORST_STEPS"]

# the per-rank figures a rank's deviation looks at: time first (what a slow rank changes), then
# the straggler time, the wait it caused, then what it issued
DEVIATION_FIGURES = ("comm_time_s", "straggler_s", "caused_wait_s", "collectives", "bytes")
WORST_STEPS = 3  # the steps a rank row names: its worst, worst first


@dataclass(frozen=True)
class StepExcess:
    """A step where a rank spent more time in collectives than the median rank did there."""

    step: int
    excess_s: float  # the rank's time at the step minus the median of every timed rank's

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "excess_s": self.excess_s}


@dataclass
class RankStats:
    rank: int
    host: str | None
    collectives: int = 0
    bytes: int | None = 0  # of the calls whose size is known; None when none is
    unknown_size: int = 0  # calls whose size is not known (a trace without shapes)
    timed: int = 0
    comm_time_s: float | None = None
    elapsed_s: float | None = None
    recorded_s: float | None = None
    share_time_s: float | None = None  # the time its share is over: the steps its calls were timed in (commdebug.analysis.shares)
    straggler_s: float | None = None
    # timed calls on no known group (a trace that records none): no other rank's call pairs with them
    timed_without_group: int = 0
    worst_steps: list[StepExcess] = field(default_factory=list)  # worst first, at most WORST_STEPS
    caused_wait_s: float | None = None  # the wait it made the others spend, where it arrived last

    @property
    def share(self) -> float | None:
        return self.comm_time_s / self.share_time_s if self.comm_time_s is not None and self.share_time_s else None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["share"] = self.share
        d["worst_steps"] = [w.to_dict() for w in self.worst_steps]
        return d


@dataclass
class OpStats:
    op: str
    calls: int = 0
    bytes: int = 0  # of the calls whose size is known
    unknown_size: int = 0  # calls whose size is not known: not in bytes or the bandwidths
    timed: int = 0
    time_s: float = 0.0
    bus_bytes: float = 0.0  # sum of S x factor over timed calls whose size and factor are known
    timed_bytes: int = 0
    sized_s: float = 0.0  # time of the timed calls whose size is known
    bus_s: float = 0.0  # time of those whose busbw factor is known too
    # None: unknown (--ranks left out members of a group it ran on, or its calls name no group to pair them by)
    straggler_s: float | None = None

    @property
    def algbw_gbps(self) -> float | None:
        return self.timed_bytes / self.sized_s / 1e9 if self.sized_s > 0 else None

    @property
    def busbw_gbps(self) -> float | None:
        return self.bus_bytes / self.bus_s / 1e9 if self.bus_s > 0 else None

    @property
    def known_bytes(self) -> int | None:
        """Its bytes, None when no call's size is known."""
        return known_bytes(self.bytes, self.unknown_size, self.calls)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "calls": self.calls, "bytes": self.known_bytes, "unknown_size_calls": self.unknown_size, "timed_calls": self.timed,
            "time_s": self.time_s if self.timed else None, "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps, "straggler_s": self.straggler_s if self.timed else None,
        }


# the figures of an op's row that add up over ranks
_OP_SUMS = ("calls", "bytes", "unknown_size", "timed", "time_s", "timed_bytes", "bus_bytes", "sized_s", "bus_s")


@dataclass(frozen=True)
class Deviation:
    """How far one rank lies from the median rank: the figure furthest from its median, and by
    how much, relative to that median (+1.5: 150% above; -0.5: half of it)."""

    rank: int
    figure: str | None  # None: every figure is the median's
    relative: float

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "figure": self.figure, "relative": self.relative}


@dataclass
class Report:
    ranks: list[RankStats]
    ops: list[OpStats]
    timed: bool
    notes: list[str] = field(default_factory=list)
    imbalance: list[Imbalance] = field(default_factory=list)  # all_to_all, worst first
    late: LateRanks | None = None  # who made the others wait
    absence: Absence | None = None  # the job's ranks not in the files read (a node's folder)
    unpaired: int = 0  # timed calls that name no group: no call of another rank pairs with them

    def spread(self, attribute: str) -> dict[str, Any] | None:
        """min / median / max of a per-rank figure, with the ranks holding min and max."""
        values = [(getattr(r, attribute), r.rank) for r in self.ranks if getattr(r, attribute) is not None]
        if not values:
            return None
        lo, hi = min(values), max(values, key=lambda v: (v[0], -v[1]))
        return {"min": lo[0], "min_rank": lo[1], "median": statistics.median(v for v, _ in values), "max": hi[0], "max_rank": hi[1]}

    def deviations(self) -> list[Deviation]:
        """Every rank's :class:`Deviation`, furthest first (ties in rank order). A figure whose
        median is 0 counts a rank with any of it as 100% away. The wait a rank caused is
        measured against the median rank's communication time (its own median is a sum of
        jitter: a rank twice as unlucky is not an outlier)."""
        medians = {}
        for figure in DEVIATION_FIGURES:
            values = [getattr(r, figure) for r in self.ranks if getattr(r, figure) is not None]
            if values:
                medians[figure] = statistics.median(values)
        scale = {figure: abs(med) for figure, med in medians.items()}
        if "caused_wait_s" in medians and medians.get("comm_time_s"):
            scale["caused_wait_s"] = medians["comm_time_s"]
        out = []
        for r in self.ranks:
            best: tuple[float, str | None, float] = (0.0, None, 0.0)
            for figure, med in medians.items():
                v = getattr(r, figure)
                if v is None:
                    continue
                rel = (v - med) / scale[figure] if scale[figure] else (1.0 if v else 0.0)
                if abs(rel) > best[0] + 1e-12:
                    best = (abs(rel), figure, rel)
            out.append(Deviation(r.rank, best[1], best[2]))
        out.sort(key=lambda d: (-abs(d.relative), d.rank))
        return out

    def top(self, k: int) -> list[tuple[RankStats, Deviation]]:
        """The `k` ranks furthest from the median (:meth:`deviations`), furthest first."""
        by_rank = {r.rank: r for r in self.ranks}
        return [(by_rank[d.rank], d) for d in self.deviations()[:k]]

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """Plain data for ``--json``; with `top` (> 0), ``ranks`` holds only the `top` ranks
        furthest from the median, furthest first, each with its ``deviation``, and
        ``ranks_total`` says how many there were (the spread still covers every rank)."""
        if top:
            shown = [dict(r.to_dict(), deviation=d.to_dict()) for r, d in self.top(top)]
            return {"ranks": shown, "ranks_total": len(self.ranks), **{k: v for k, v in self.to_dict().items() if k != "ranks"}}
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "spread": {a: self.spread(a) for a in ("collectives", "bytes", "comm_time_s", "elapsed_s", "share", "straggler_s", "caused_wait_s")},
            "ops": [o.to_dict() for o in self.ops],
            "timed": self.timed,
            "notes": self.notes,
            "all_to_all_imbalance": [i.to_dict() for i in self.imbalance],
            "late_ranks": [] if self.late is None else self.late.to_dict(),
            "startup_skew": [] if self.late is None else self.late.startup_to_dict(),
            "late_analysis": None if self.late is None else {
                "threshold": self.late.threshold.to_dict(), "timed": self.late.timed, "calls_analysed": self.late.analysed,
                "calls_partial": self.late.partial, "gaps_known": self.late.gaps_known},
        }


@dataclass
class RankDigest:
    """One rank's share of the report, small and picklable: its totals, its per-op sums, its
    time per step and, per group, its timed calls' sequence numbers and latencies as flat
    arrays. A folder read by worker processes has them made there (``read_all(...,
    digest=rank_digest)``); either way the report merges the same digests, in rank order."""

    stats: RankStats
    ops: list[OpStats]  # in first-call order
    steps: array  # the steps it timed calls in, ascending, and its time at each
    step_times: array
    notes: list[str]
    # per group, in first-timed-call order: (name, seqs, latencies, op ids into op_names), in call order
    paired: list[tuple[str, array, array, array]]
    op_names: list[str]  # of the paired calls, first seen first
    # per entry of `paired`: op id -> the exact sum (math.fsum) of its latencies on that group
    paired_sums: list[dict[int, float]]
    groups: dict[str, GroupInfo]  # each paired group's, where the dump has it
    all_to_all: list[CollectiveEvent]  # its all_to_all calls (with a sequence number): the imbalance
    late: LateDigest  # its share of the late-rank analysis
    placement: Placement = Placement(None)  # its host and node: a missing rank may be on another node
    world_size: int = 0


def rank_digest(view: RankView) -> RankDigest:
    """The :class:`RankDigest` of one rank (what a worker process returns for ``report``),
    summed a column at a time: per op and per step over the calls' columns, in C."""
    meta = view.metadata
    events = view.events
    s = RankStats(view.rank, meta.get("hostname"), elapsed_s=meta.get("elapsed_s"), recorded_s=meta.get("recorded_s", meta.get("elapsed_s")))
    ops_col = list(map(OP, events))
    sizes = list(map(SIZE, events))
    lats = list(map(LATENCY, events))
    timed = list(map(IS_NOT_NONE, lats))
    all_timed = all(timed)
    s.unknown_size = sizes.count(None)
    s.collectives, s.bytes = len(events), known_bytes(sum(v for v in sizes if v is not None), s.unknown_size, len(events))
    s.timed = len(events) if all_timed else sum(timed)
    t_lats = lats if all_timed else list(compress(lats, timed))
    ops: list[OpStats] = []
    kinds = dict.fromkeys(ops_col)
    for op in kinds:  # first call first
        mine = list(map(op.__eq__, ops_col))
        own_sizes = list(compress(sizes, mine))
        o = OpStats(op, mine.count(True), sum(v for v in own_sizes if v is not None), own_sizes.count(None))
        if not all_timed:
            mine = list(map(_and, mine, timed))
        o.timed = mine.count(True)
        if o.timed:
            o.time_s = sum(compress(lats, mine))
            if not o.unknown_size and None not in map(BUSBW, compress(events, mine)):  # the usual case, in C
                o.timed_bytes = sum(compress(sizes, mine))
                o.bus_bytes = sum(map(_mul, compress(sizes, mine), compress(map(BUSBW, events), mine)))
                o.sized_s = o.bus_s = o.time_s
            else:  # sizes or group sizes not known: each bandwidth over the calls it can divide
                for e in compress(events, mine):
                    if e.size_bytes is not None and e.latency_s is not None:
                        o.timed_bytes += e.size_bytes
                        o.sized_s += e.latency_s
                        if e.busbw_factor is not None:
                            o.bus_bytes += e.size_bytes * e.busbw_factor
                            o.bus_s += e.latency_s
        ops.append(o)
    times = (array("q"), array("d"))
    t_steps: list[int] | None = None
    if s.timed:
        s.comm_time_s = sum(t_lats)
        t_steps = list(map(STEP, events if all_timed else compress(events, timed)))
        times = step_times(t_steps, t_lats)
    paired = []
    paired_sums: list[dict[int, float]] = []
    infos: dict[str, GroupInfo] = {}
    op_ids: dict[str, int] = {}
    seqs = list(map(SEQ, events))
    pairable = list(map(_and, timed, map(IS_NOT_NONE, seqs)))
    s.timed_without_group = sum(1 for e, ok in zip(events, timed, strict=True)
                                if ok and e.seq is None and e.op not in ("send", "recv") and e.group.name == "?")
    names: list[str] | None = None
    masks: dict[str, list[bool]] = {}  # group -> which calls are its pairable ones
    if any(pairable):
        names = list(map(GROUP_NAME, events))
        for op in compress(ops_col, pairable):  # ids in first-paired-call order
            if op not in op_ids:
                op_ids[op] = len(op_ids)
        for name in dict.fromkeys(compress(names, pairable)):
            mine = masks[name] = list(map(_and, map(name.__eq__, names), pairable))
            g_lats = array("d", compress(lats, mine))
            g_ops = array("i", map(op_ids.__getitem__, compress(ops_col, mine)))
            paired.append((name, array("q", compress(seqs, mine)), g_lats, g_ops))
            # exact sums, so that a rank whose every call took the least latency is 0, not 3e-18
            if g_ops.count(g_ops[0]) == len(g_ops):
                paired_sums.append({g_ops[0]: fsum(g_lats)})
            else:
                paired_sums.append({o: fsum(compress(g_lats, map(o.__eq__, g_ops))) for o in dict.fromkeys(g_ops)})
            if name in view.groups:
                infos[name] = view.groups[name]
    a2a = [e for e in events if e.op == "all_to_all" and e.seq is not None] if "all_to_all" in ops_col else []
    notes = list(view.notes)
    base = share_base(events, meta, view.profile, older.steps if (older := older_of(view)) is not None else None)
    s.share_time_s = base.seconds
    notes += [base.note()] if s.timed and base.partial else []
    # a fatal signal, or no final dump: how the rank's process ended, as far as known (as check says it)
    ending = ending_note(meta, process_alive(meta) if meta.get("ended_by") in (None, "hang") else None)
    if ending is not None:
        notes.append(ending)
    return RankDigest(s, ops, times[0], times[1], notes, paired, list(op_ids), paired_sums, infos, a2a,
                      late_digest(view.rank, events, times=times, lats=lats, seqs=seqs, ops=ops_col, names=names,
                                  steps=t_steps if all_timed else None, timed=timed, masks=masks,
                                  known={name: Known(seqs_of, lats_of) for name, seqs_of, lats_of, _ in paired}, kinds=kinds),
                      placement_of(meta), int(meta.get("world_size") or 0))




def report(ranks: Iterable[RankView | RankDigest], *, chosen: str = "all", late_threshold: LateThreshold | None = None,
           gap_ops: GapOps | None = None, scope: FolderScope | None = None) -> Report:
    """Report on a job's ranks (see the module docstring); each rank as its view or its
    :func:`rank_digest`. `chosen`: the ``--ranks`` the ranks given were picked by ("all": every
    rank of the job); with a choice, a call whose group has members that were not given has no
    known least latency, so its straggler time is unknown (None), and a note says so.
    `late_threshold`: when a late rank is listed (default 50 ms and 10% of the step's median
    communication time); `gap_ops`: what a late rank ran in its gap, from profiled steps
    (:data:`commdebug.analysis.late.GapOps`; none: ``gap_top`` stays empty). `scope`: what the
    reader saw around the files (:attr:`commdebug.formats.folders.JobFiles.scope`): the ranks of
    the job not in them (a node's folder) leave straggler times unknown as ``--ranks`` does.

    >>> rep = report(iter_selected("traces/", Selection.parse("0-7", "--ranks")), chosen="0-7")  # doctest: +SKIP
    >>> [(e.step, e.rank, e.worst.caused_s) for e in rep.late.entries][:1]   # doctest: +SKIP
    [(2, 3, 2.41)]
    """
    stats: list[RankStats] = []
    late = LateTally(late_threshold, gap_ops)
    ops: dict[str, OpStats] = {}
    stragglers = _Stragglers(late, every_member=chosen != "all")
    step_times: dict[int, tuple[array, array]] = {}  # rank -> (its steps, its time at each)
    notes: dict[str, list[int]] = {}  # a rank's note -> the ranks that have it: said once
    a2a = ImbalanceTally()
    placements: dict[int, Placement] = {}
    world = 0
    for view in ranks:
        d = view if isinstance(view, RankDigest) else rank_digest(view)
        s = d.stats
        placements[s.rank] = d.placement
        world = max(world, d.world_size)
        for mine in d.ops:
            o = ops.get(mine.op)
            if o is None:
                ops[mine.op] = mine
                continue
            for name in _OP_SUMS:
                setattr(o, name, getattr(o, name) + getattr(mine, name))
        stragglers.add_rank(s.rank, d)
        late.add(d.late)
        if s.timed:
            step_times[s.rank] = (d.steps, d.step_times)  # two flat arrays, not a dict: 16 bytes a step
        for n in d.notes:
            notes.setdefault(n, []).append(s.rank)
        if d.all_to_all:
            a2a.add(s.rank, d.all_to_all)
        stats.append(s)
    away = absence(world, placements, scope) if chosen == "all" else None  # --ranks: its own note
    if away is not None and away.elsewhere:
        stragglers.every_member = True  # a call's least latency is over members not in these files
    unknown = stragglers.finish(stats, ops)  # group names
    medians = step_medians(list(step_times.values()))
    _worst_steps(stats, step_times, medians)
    found = late.result(medians)
    if found.analysed:
        for s in stats:
            if s.timed:
                s.caused_wait_s = found.caused_by_rank.get(s.rank, 0.0)
    stats.sort(key=lambda r: r.rank)
    op_rows = sorted(ops.values(), key=lambda o: (-o.time_s, -o.bytes, o.op))
    unpaired = sum(s.timed_without_group for s in stats)
    lines = [f"{who(rs)}: {n}" for n, rs in notes.items()]
    said = None if away is None else away.note()
    if said is not None:
        lines.insert(0, said)
    if unknown:
        labels = sorted({stragglers.labels.get(name, f"group {name}") for name in unknown})
        why = f"--ranks {chosen} leaves" if said is None else f"the ranks not in {away.scope.where() if away and away.scope else 'the dumps read'} leave"
        lines.append(f"straggler time unknown ('?') where {why} out members of the call's group "
                     f"({_count(unknown, 'group')}: {', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''}): "
                     "a call's least latency is over every member")
    if unpaired:
        lines.append(f"straggler time unknown ('?') for {_count(range(unpaired), 'timed call')} that name no process group "
                     "(the traces record none): a call is paired across ranks by its group and sequence number")
    return Report(stats, op_rows, any(r.timed for r in stats), lines, a2a.rows(), found, away, unpaired)


def _count(items: Iterable[Any], word: str) -> str:
    n = len(list(items))
    return f"{n} {word}{'s' if n != 1 else ''}"


def _worst_steps(stats: list[RankStats], step_times: dict[int, tuple[array, array]], medians: dict[int, float]) -> None:
    """Fill each timed rank's ``worst_steps``: its steps furthest above the median rank's time
    at the same step (`medians`; a step of one rank only has no median to exceed)."""
    for s in stats:
        if s.rank not in step_times:
            continue
        steps, times = step_times[s.rank]
        over = [(t - medians[step], step) for step, t in zip(steps, times, strict=True)
                if step in medians and t > medians[step]]
        over.sort(key=lambda x: (-x[0], x[1]))
        s.worst_steps = [StepExcess(step, excess) for excess, step in over[:WORST_STEPS]]


class _GroupOps:
    """Per sequence number of one group: the op of the call (the first rank's that timed it), as
    an id; an integer array from ``base`` on (-1: not seen)."""

    __slots__ = ("base", "op")

    def __init__(self, base: int) -> None:
        self.base = base
        self.op = array("i")

    def cover(self, first: int, last: int) -> None:
        """Make room for sequence numbers first..last."""
        if first < self.base:  # a rank that kept older calls (events dropped elsewhere): grow at the front
            self.op = array("i", [-1]) * (self.base - first) + self.op
            self.base = first
        grow = last - self.base + 1 - len(self.op)
        if grow > 0:
            self.op.extend(array("i", [-1]) * grow)


class _Stragglers:
    """Straggler time in one pass and memory that does not grow with the number of ranks.

    The straggler time of a rank's calls of one op on one group is the sum of their latencies
    minus the sum of the calls' least latencies on any member. Per rank it keeps, per group, the
    spans of sequence numbers it timed (usually one) and the exact sum (:func:`math.fsum`) of
    its latencies per op; per group, the op of each call. The least latency of each call is the
    late-rank analysis's (:class:`~commdebug.analysis.late_tally.LateTally` compares every
    member's calls as it merges them), and how many ranks timed it is counted from the spans.
    At the end each span's least latencies are summed exactly too (once per distinct span: the
    members of a group time the same calls). Exact sums of equal values are equal, so a rank
    that took the least latency on every call has exactly 0, never float noise; the positive
    parts are then summed per rank and per op (no cancellation left)."""

    def __init__(self, late: LateTally, every_member: bool = False) -> None:
        self.late = late  # its least latency of each call
        self.every_member = every_member  # a call's least needs every member of its group timing it
        self.groups: dict[str, _GroupOps] = {}
        self.sizes: dict[str, int] = {}  # 0: unknown
        self.labels: dict[str, str] = {}  # how reports name the group
        self.op_ids: dict[str, int] = {}
        # rank -> (per group, its spans of sequence numbers; per (group, op id), its exact latency sum)
        self.ranks: dict[int, tuple[dict[str, list[list[int]]], dict[tuple[str, int], float]]] = {}

    def add_rank(self, rank: int, d: RankDigest) -> None:
        """One rank's timed calls (its digest's ``paired`` groups, in call order): a run of
        consecutive sequence numbers (the usual case) is merged a slice at a time, in C;
        anything else a call at a time."""
        spans: dict[str, list[list[int]]] = {}
        sums: dict[tuple[str, int], float] = {}
        self.ranks[rank] = (spans, sums)
        op_ids = self.op_ids
        ids = [op_ids.setdefault(op, len(op_ids)) for op in d.op_names]
        for (name, seqs, _, local), own in zip(d.paired, d.paired_sums, strict=True):
            for op, total in own.items():
                sums[(name, ids[op])] = total
            info = d.groups.get(name)
            if info is not None:
                self.sizes[name] = max(self.sizes.get(name, 0), info.size)
                self.labels.setdefault(name, info.label)
            first, n = seqs[0], len(seqs)
            calls = self.groups.get(name)
            if calls is None:
                calls = self.groups[name] = _GroupOps(first)
            runs = spans.setdefault(name, [])
            if seqs[-1] - first != n - 1 or first < calls.base or any(map(_gt, seqs, seqs[1:])):
                calls.cover(min(seqs), max(seqs))
                at = calls.op
                for seq, op in zip(seqs, local, strict=True):
                    if at[seq - calls.base] < 0:
                        at[seq - calls.base] = ids[op]
                    if runs and runs[-1][1] + 1 == seq:
                        runs[-1][1] = seq
                    else:
                        runs.append([seq, seq])
                continue
            calls.cover(first, seqs[-1])
            lo = first - calls.base
            hi = lo + n
            if -1 in calls.op[lo:hi]:  # calls first seen here take this rank's ops
                mine = array("i", map(ids.__getitem__, local))
                calls.op[lo:hi] = array("i", (o if o >= 0 else m for o, m in zip(calls.op[lo:hi], mine, strict=True)))
            if runs and runs[-1][1] + 1 == first:
                runs[-1][1] = seqs[-1]
            else:
                runs.append([first, seqs[-1]])

    def _least(self, name: str, runs: tuple[tuple[int, ...], ...], op: int, counts: array | None) -> float | None:
        """The exact sum of the least latencies of `op`'s calls in `runs` of group `name`; None
        when some member's latency is not known (``every_member``) for one of them. `counts`:
        how many ranks timed each call of the group (from its ops' ``base``; ``every_member``
        only)."""
        calls = self.groups[name]
        base, size = calls.base, self.sizes.get(name, 0)
        least_base, least = self.late.least(name)
        parts, many = [], []
        for first, last in runs:
            lo, hi = first - base, last - base + 1
            ops = calls.op[lo:hi]
            them = least[first - least_base:last - least_base + 1]
            every = ops.count(op) == hi - lo
            parts.append(them if every else array("d", compress(them, map(op.__eq__, ops))))
            if counts is not None:
                many.append(counts[lo:hi] if every else array("i", compress(counts[lo:hi], map(op.__eq__, ops))))
        if self.every_member and (size <= 0 or min(chain.from_iterable(many), default=size) < size):
            return None
        return fsum(chain.from_iterable(parts))

    def _counts(self) -> dict[str, array]:
        """Per group, how many ranks timed each call (from its ops' ``base`` on), from the
        ranks' spans (a rank that timed a number twice counts twice)."""
        diffs = {name: [0] * (len(calls.op) + 1) for name, calls in self.groups.items()}
        for spans, _ in self.ranks.values():
            for name, runs in spans.items():
                diff, base = diffs[name], self.groups[name].base
                for first, last in runs:
                    diff[first - base] += 1
                    diff[last - base + 1] -= 1
        return {name: array("i", accumulate(diff[:-1])) for name, diff in diffs.items()}

    def finish(self, stats: list[RankStats], ops: dict[str, OpStats]) -> set[str]:
        """Fill each rank's and op's ``straggler_s``; return the groups whose calls' least
        latency was unknown (their ranks' and ops' figures are None)."""
        names = {i: op for op, i in self.op_ids.items()}
        by_rank = {s.rank: s for s in stats}
        counts = self._counts() if self.every_member else {}
        least: dict[tuple[str, tuple[tuple[int, ...], ...], int], float | None] = {}
        per_op: dict[str, list[float]] = {}
        unknown_ops: set[str] = set()
        unknown: set[str] = set()
        for rank, (spans, sums) in self.ranks.items():
            if not sums:
                continue
            parts: list[float] | None = []
            for (name, op), total in sums.items():
                key = (name, tuple(map(tuple, spans[name])), op)
                if key not in least:
                    least[key] = self._least(*key, counts.get(name))
                floor = least[key]
                if floor is None:
                    unknown.add(name)
                    unknown_ops.add(names[op])
                    parts = None
                    continue
                beyond = total - floor if total > floor else 0.0
                per_op.setdefault(names[op], []).append(beyond)
                if parts is not None:
                    parts.append(beyond)
            by_rank[rank].straggler_s = None if parts is None else fsum(parts)
        for name in self.op_ids:
            ops[name].straggler_s = None if name in unknown_ops else fsum(per_op.get(name, []))
        return unknown


def report_path(path: Dumps, *, late_threshold: LateThreshold | None = None) -> Report:
    """:func:`report` over a folder of rank dumps, a folder of per-node folders, several
    folders, or one dump."""
    job = find_job(path)
    return report(read_views(job.files, digest=rank_digest), late_threshold=late_threshold, scope=job.scope)
