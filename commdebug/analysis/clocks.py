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
   clock ``max(start) <= min(end)``. Each clock's offset from the others gets bounds from
   that (a call that one host joined last says how far ahead the other host's clock can be)
   and is taken in the middle of them, so it is off by half their width at most. A clock
   whose calls contradict the others' (a clock stepped during the run, or times that are not
   comparable) is placed where the members' ends agree instead (they finish within moments of
   each other: the median over calls, robust to a rank the scheduler woke late), and bounds no
   other clock. That needs each call's span to hold the moment it finished on that rank:
   true of calls timed on the host clock (CPU backends, whose timer runs from the call to the
   wait's return), not of calls timed on a GPU (their start is the host's issue, their length
   the kernel's: the kernel may have run long after the issue), so a rank whose calls were timed
   on a GPU keeps no calls for this (``ClockDigest.gpu_timed``; ``metadata.timed_on`` says, and in
   dumps from before it, a backend that names a GPU one).

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



@dataclass
class ClockDigest:
    """What the alignment keeps of one rank: its host, its start on the wall clock (None: the
    dump does not say), whether that is to the microsecond, and per group the sequence numbers,
    starts and ends (seconds on its own clock) of its timed blocking calls, a sample of the same
    sequence numbers on every rank; ``gpu_timed``: its calls were timed on a GPU, so none is
    kept."""

    rank: int
    host: str | None
    start_wall_s: float | None
    exact: bool
    calls: dict[str, tuple[array, array, array]] = field(default_factory=dict)
    gpu_timed: bool = False


# backends that run collectives on a GPU, for dumps from before metadata.timed_on
_GPU_BACKENDS = frozenset({"nccl", "xccl", "hccl", "mccl"})


def _gpu_timed(meta: dict[str, Any]) -> bool:
    """Whether some of a dump's calls were timed on a GPU: ``metadata.timed_on`` holds
    ``"gpu"``; in a dump from before it, its backend names a GPU one (``"nccl"``,
    ``"cpu:gloo,cuda:nccl"``; ``"undefined"``, torch's word for a backend left to the device,
    does not: nothing says a GPU was used)."""
    timed_on = meta.get("timed_on")
    if isinstance(timed_on, list):
        return "gpu" in timed_on
    backend = meta.get("backend")
    if not isinstance(backend, str):
        return False
    return any(part.rpartition(":")[2].strip() in _GPU_BACKENDS for part in backend.split(","))


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
    digest = ClockDigest(view.rank, host if isinstance(host, str) else None, start, exact, gpu_timed=_gpu_timed(view.metadata))
    if digest.gpu_timed:
        return digest
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
        """How far the true offset can be from ``offset_s``, by the bounds (None: unbounded, or
        bounds that contradict each other)."""
        if self.low_s is None or self.high_s is None or self.low_s > self.high_s:
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
    gpu_timed: tuple[int, ...] = ()  # ranks whose calls were timed on a GPU: none of them used

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "per": self.per, "origin_wall_s": self.origin_wall_s, "calls": self.calls,
                "gpu_timed_ranks": list(self.gpu_timed),
                "clocks": [c.to_dict() for c in self.clocks], "shift_s": {str(r): s for r, s in sorted(self.shift_s.items())}}


def align_clocks(digests: Iterable[ClockDigest]) -> Clocks:
    """The :class:`Clocks` of the ranks' digests (see the module docstring). Work grows with
    the (call, clock) pairs of the calls shared by several clocks, not with their product:
    each call is first reduced to, per clock, its members' latest start and earliest end."""
    ranks = sorted(digests, key=lambda d: d.rank)
    if not ranks or any(d.start_wall_s is None for d in ranks):
        return Clocks({d.rank: 0.0 for d in ranks}, "own starts", "rank")
    per = "host" if all(d.exact for d in ranks) else "rank"
    names = {d.rank: (f"host {d.host}" if per == "host" else f"rank {d.rank}") for d in ranks}
    clocks = list(dict.fromkeys(names[d.rank] for d in ranks))  # the first rank's clock first: the reference
    index = {name: i for i, name in enumerate(clocks)}
    # per call: per clock, (its members' latest start, earliest end) on the wall clock
    calls: dict[tuple[str, int], dict[int, list[float]]] = {}
    for d in ranks:
        k, base = index[names[d.rank]], float(d.start_wall_s or 0.0)
        for name, (seqs, starts, ends) in d.calls.items():
            for seq, st, en in zip(seqs, starts, ends, strict=True):
                cell = calls.setdefault((name, seq), {}).setdefault(k, [-math.inf, math.inf])
                cell[0] = max(cell[0], base + st)
                cell[1] = min(cell[1], base + en)
    # only calls timed on more than one clock say anything about the clocks
    shared = [tuple((k, c[0], c[1]) for k, c in by_clock.items()) for by_clock in calls.values() if len(by_clock) > 1]
    offset = [0.0] * len(clocks)
    bad: set[int] = set()
    trusted = shared
    if shared:
        for _ in range(2):  # first where the ends agree (robust to a few odd calls), to judge the clocks by
            offset = _ends_estimates(shared, offset)
        # a clock whose times contradict most others' (it "ends" calls before most members began them):
        # its calls would bound every clock it shares them with, so the others are bounded without it
        bad = _contradicting(shared, offset)
        trusted = [c for c in (tuple(m for m in call if m[0] not in bad) for call in shared) if len(c) > 1]
        for _ in range(_ROUNDS if len(clocks) > 2 else 1):  # two clocks: one pass is exact
            low, high, _ = _bounds(trusted, offset)
            for k in range(1, len(clocks)):  # each clock in the middle of what the calls allow, the reference at 0
                if k not in bad and low[k] <= high[k] and math.isfinite(low[k]) and math.isfinite(high[k]):
                    offset[k] = (low[k] + high[k]) / 2
    low, high, used = _bounds(trusted, offset)  # what bounds each clock: the trusted calls; an odd clock, its own
    odd = _bounds(shared, offset)
    for k in bad:
        low[k], high[k], used[k] = odd[0][k], odd[1][k], odd[2][k]
    members: dict[int, list[int]] = {}
    for d in ranks:
        members.setdefault(index[names[d.rank]], []).append(d.rank)
    out = [HostClock(_host(ranks, members[k]), tuple(members[k]), offset[k], None if k == 0 or not used[k] else low[k],
                     None if k == 0 or not used[k] else high[k], used[k]) for k in range(len(clocks))]
    aligned = {d.rank: float(d.start_wall_s or 0.0) + offset[index[names[d.rank]]] for d in ranks}
    origin = min(aligned.values())
    return Clocks({r: t - origin for r, t in aligned.items()}, "calls" if shared else "start times", per, out, origin, len(shared),
                  tuple(d.rank for d in ranks if d.gpu_timed))


def _host(ranks: list[ClockDigest], members: list[int]) -> str | None:
    hosts = {d.host for d in ranks if d.rank in members}
    return hosts.pop() if len(hosts) == 1 else None


def _bounds(shared: list[tuple[tuple[int, float, float], ...]], offset: list[float]) -> tuple[list[float], list[float], list[int]]:
    """Per clock, the offsets every call it shares allows, the other clocks at their `offset`
    (on a true clock the last member's start is before every member's end: max(their starts) <=
    my earliest end + x, and my latest start + x <= min(their ends)), and how many calls."""
    n = len(offset)
    low, high, used = [-math.inf] * n, [math.inf] * n, [0] * n
    for call in shared:
        starts = sorted(((s + offset[k], k) for k, s, _ in call), reverse=True)[:2]  # the two latest starts
        ends = sorted((e + offset[k], k) for k, _, e in call)[:2]  # the two earliest ends
        for k, s, e in call:
            their_start = starts[0][0] if starts[0][1] != k else starts[1][0]
            their_end = ends[0][0] if ends[0][1] != k else ends[1][0]
            low[k] = max(low[k], their_start - e)
            high[k] = min(high[k], their_end - s)
            used[k] += 1
    return low, high, used


def _ends_estimates(shared: list[tuple[tuple[int, float, float], ...]], offset: list[float]) -> list[float]:
    """Per clock, the offset that makes its ends agree with the others' (each call's median end
    over its clocks, at their `offset`): the median over the calls it shares; the reference
    (clock 0) stays at 0."""
    moves: list[list[float]] = [[] for _ in offset]
    for call in shared:
        consensus = statistics.median(e + offset[k] for k, _, e in call)
        for k, _, e in call:
            moves[k].append(consensus - e)
    new = [statistics.median(m) if m else x for m, x in zip(moves, offset, strict=True)]
    return [x - new[0] for x in new]


def _contradicting(shared: list[tuple[tuple[int, float, float], ...]], offset: list[float]) -> set[int]:
    """The clocks that, at `offset`, contradict most members in a quarter of their calls or more: they end a
    call before the median member began it, or begin it after the median member ended it
    (impossible on a true clock: the last member's start is before every member's end)."""
    calls, against = [0] * len(offset), [0] * len(offset)
    for call in shared:
        if len(call) < 3:
            continue  # two clocks: no majority to side with
        mid_start = statistics.median(s + offset[k] for k, s, _ in call)
        mid_end = statistics.median(e + offset[k] for k, _, e in call)
        for k, s, e in call:
            calls[k] += 1
            if e + offset[k] < mid_start or s + offset[k] > mid_end:
                against[k] += 1
    return {k for k in range(len(offset)) if calls[k] and against[k] * 4 > calls[k]}
