"""One clock for every rank of a job: where each rank's own times (seconds from its recording's
start) lie on a shared timeline, for ``commdebug trace``.

Each rank counts its events from its own start, and ranks start hundreds of milliseconds apart
(each process gets to the recording at its own pace). Two facts put them on one clock:

1. **Each dump's wall-clock start**: ``metadata.start_wall_s`` (to the microsecond; dumps
   written before it have ``start_time``, to the millisecond). Ranks on one host read one
   clock, so on one host this alone places them (to the millisecond with ``start_time``
   only). Hosts' clocks differ by whatever NTP left (milliseconds), or by anything without it.
2. **Blocking collectives**: no member of an all_reduce, all_gather, reduce_scatter,
   all_to_all or barrier can finish before every member has joined it. So for every call
   timed on several ranks, the last member's start is before every member's end: on a true
   clock ``max(start) <= min(end)``. Each pair of clocks gets bounds from that (a call that one
   host joined last says how far ahead the other host's clock can be), and, within the
   bounds, the estimate that makes the members' ends agree (they finish within moments of
   each other: the median over calls, robust to a rank the scheduler woke late).

A *clock* is a host when every dump has ``start_wall_s`` (its ranks share it exactly), else a
rank (each one's ``start_time`` is off by up to a millisecond). The first rank's clock is the
reference. :func:`clock_digest` keeps of a rank its start and, per group, the starts and ends
of up to :data:`CALLS_PER_GROUP` of its blocking calls (the same sequence numbers on every
rank), so a thousand ranks cost a few megabytes; :func:`align_clocks` turns the digests into
:class:`Clocks`, whose per-clock ``low_s``/``high_s`` bound each offset: what an arrow between
ranks on different clocks can run back by.

>>> clocks = align_clocks(clock_digest(v) for v in iter_ranks("traces/"))   # doctest: +SKIP
>>> clocks.shift_s[3]                                                       # doctest: +SKIP
0.4127
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from commdebug.model.rank_view import RankView
from commdebug.ops import needs_all

__all__ = ["ClockDigest", "HostClock", "Clocks", "clock_digest", "align_clocks", "CALLS_PER_GROUP"]

CALLS_PER_GROUP = 256  # blocking calls per group a rank keeps for the alignment, at most
_ROUNDS = 4  # refinements of the offsets; each uses the last one's consensus ends

Call = tuple[str, int]  # (group name, sequence number)
Member = tuple[int, float, float]  # (rank, start, end) on its clock, in wall seconds


@dataclass
class ClockDigest:
    """What the alignment keeps of one rank: its host, its start on the wall clock (None: the
    dump does not say), whether that is to the microsecond, and per group the sequence numbers,
    starts and ends (seconds on its own clock) of its timed blocking calls, a sample of the same
    sequence numbers on every rank."""

    rank: int
    host: str | None
    start_wall_s: float | None
    exact: bool
    calls: dict[str, tuple[array, array, array]] = field(default_factory=dict)


def _wall(meta: dict[str, Any]) -> tuple[float | None, bool]:
    """A rank's start on the wall clock (seconds since the epoch) and whether it is exact."""
    exact = meta.get("start_wall_s")
    if isinstance(exact, (int, float)) and not isinstance(exact, bool) and math.isfinite(exact):
        return float(exact), True
    text = meta.get("start_time")
    if not isinstance(text, str):
        return None, False
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None, False
    return (moment.timestamp(), False) if moment.tzinfo is not None else (None, False)  # no zone: no shared clock


def clock_digest(view: RankView) -> ClockDigest:
    """A rank's :class:`ClockDigest`: a module-level function, so worker processes make it
    where they read the rank."""
    host = view.metadata.get("hostname")
    start, exact = _wall(view.metadata)
    digest = ClockDigest(view.rank, host if isinstance(host, str) else None, start, exact)
    by_group: dict[str, list[tuple[int, float, float]]] = {}
    for e in view.events:
        if (e.seq is None or e.latency_s is None or e.start_s is None or e.in_flight or e.error is not None
                or not needs_all(e.op)):
            continue
        by_group.setdefault(e.group.name, []).append((e.seq, e.start_s, e.start_s + e.latency_s))
    for name, calls in by_group.items():
        # every member of a group keeps the same sequence numbers: a power-of-two stride, so that
        # members whose counts differ a little keep nested samples
        stride = 1 << math.ceil(math.log2(len(calls) / CALLS_PER_GROUP)) if len(calls) > CALLS_PER_GROUP else 1
        kept = [c for c in calls if c[0] % stride == 0]
        digest.calls[name] = (array("q", (c[0] for c in kept)), array("d", (c[1] for c in kept)), array("d", (c[2] for c in kept)))
    return digest


@dataclass(frozen=True)
class HostClock:
    """One clock (a host's, or one rank's) against the reference (the first rank's):
    ``offset_s`` added to its times puts them on the reference's clock, somewhere in
    [``low_s``, ``high_s``] by the calls it shares with other clocks (None: no call bounds it);
    ``calls``: how many such calls."""

    host: str | None
    ranks: tuple[int, ...]
    offset_s: float
    low_s: float | None
    high_s: float | None
    calls: int

    @property
    def uncertainty_s(self) -> float | None:
        """How far the true offset can be from ``offset_s``, by the bounds (None: unbounded)."""
        if self.low_s is None or self.high_s is None:
            return None
        return max(self.offset_s - self.low_s, self.high_s - self.offset_s, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ranks": list(self.ranks), "offset_s": self.offset_s, "low_s": self.low_s,
                "high_s": self.high_s, "uncertainty_s": self.uncertainty_s, "calls": self.calls}


@dataclass
class Clocks:
    """Where each rank's own times lie on the job's clock: ``shift_s[rank]`` added to a rank's
    own time (seconds from its start) gives seconds from the job's origin (the earliest aligned
    start, so every time is >= 0). ``method``: ``"calls"`` (start times, and clocks bounded and
    refined by blocking calls), ``"start times"`` (no call timed on two clocks), ``"own
    starts"`` (some dump has no wall-clock start: each rank from its own 0, not aligned).
    ``per``: ``"host"`` (every dump has its exact start: a host's ranks share its clock) or
    ``"rank"``."""

    shift_s: dict[int, float]
    method: str
    per: str = "host"
    clocks: list[HostClock] = field(default_factory=list)
    origin_wall_s: float | None = None
    calls: int = 0  # calls timed on two clocks or more that the alignment used

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "per": self.per, "origin_wall_s": self.origin_wall_s, "calls": self.calls,
                "clocks": [c.to_dict() for c in self.clocks], "shift_s": {str(r): s for r, s in sorted(self.shift_s.items())}}


def align_clocks(digests: Iterable[ClockDigest]) -> Clocks:
    """The :class:`Clocks` of the ranks' digests (see the module docstring)."""
    ranks = sorted(digests, key=lambda d: d.rank)
    if not ranks or any(d.start_wall_s is None for d in ranks):
        return Clocks({d.rank: 0.0 for d in ranks}, "own starts", "rank")
    per = "host" if all(d.exact for d in ranks) else "rank"
    clock_of = {d.rank: (f"host {d.host}" if per == "host" else f"rank {d.rank}") for d in ranks}
    members_of: dict[str, list[int]] = {}
    for d in ranks:
        members_of.setdefault(clock_of[d.rank], []).append(d.rank)
    start = {d.rank: float(d.start_wall_s or 0.0) for d in ranks}
    calls: dict[Call, list[Member]] = {}
    for d in ranks:
        for name, (seqs, starts, ends) in d.calls.items():
            for seq, s, e in zip(seqs, starts, ends, strict=True):
                calls.setdefault((name, seq), []).append((d.rank, start[d.rank] + s, start[d.rank] + e))
    # only calls whose members read more than one clock say anything about the clocks
    shared = {key: m for key, m in calls.items() if len({clock_of[r] for r, _, _ in m}) > 1}
    reference = clock_of[ranks[0].rank]
    offset = dict.fromkeys(members_of, 0.0)
    if shared:
        for _ in range(_ROUNDS):
            offset = _refine(shared, offset, clock_of, reference)
    out = []
    for clock, rs in members_of.items():
        low, high, n = _bounds(clock, shared, offset, clock_of)
        if low is not None and high is not None and low <= high and clock != reference:
            offset[clock] = min(max(offset[clock], low), high)  # the ends' estimate, kept within what the calls allow
        out.append(HostClock(_host(ranks, rs), tuple(rs), offset[clock],
                             None if clock == reference else low, None if clock == reference else high, n))
    aligned = {r: start[r] + offset[clock_of[r]] for r in start}
    origin = min(aligned.values())
    return Clocks({r: t - origin for r, t in aligned.items()}, "calls" if shared else "start times", per, out, origin, len(shared))


def _host(ranks: list[ClockDigest], members: list[int]) -> str | None:
    hosts = {d.host for d in ranks if d.rank in members}
    return hosts.pop() if len(hosts) == 1 else None


def _refine(shared: dict[Call, list[Member]], offset: dict[str, float], clock_of: dict[int, str], reference: str) -> dict[str, float]:
    """One round: each clock's offset to the median over its calls of (the call's consensus end
    minus its members' ends on that clock), the reference's held at 0."""
    moves: dict[str, list[float]] = {}
    for members in shared.values():
        consensus = statistics.median(e + offset[clock_of[r]] for r, _, e in members)
        for r, _, e in members:
            moves.setdefault(clock_of[r], []).append(consensus - e)
    new = {c: statistics.median(moves[c]) if c in moves else v for c, v in offset.items()}
    anchor = new[reference]
    return {c: v - anchor for c, v in new.items()}


def _bounds(clock: str, shared: dict[Call, list[Member]], offset: dict[str, float],
            clock_of: dict[int, str]) -> tuple[float | None, float | None, int]:
    """The offsets of `clock` that every call it shares allows, the other clocks at their
    `offset`: the last member's start is before every member's end (on a true clock)."""
    low, high, n = -math.inf, math.inf, 0
    for members in shared.values():
        mine = [(s, e) for r, s, e in members if clock_of[r] == clock]
        others = [(s + offset[clock_of[r]], e + offset[clock_of[r]]) for r, s, e in members if clock_of[r] != clock]
        if not mine or not others:
            continue
        n += 1
        # max(their starts) <= min(my ends) + x and max(my starts) + x <= min(their ends)
        low = max(low, max(s for s, _ in others) - min(e for _, e in mine))
        high = min(high, min(e for _, e in others) - max(s for s, _ in mine))
    if not n:
        return None, None, 0
    return low, high, n
