"""Who made the others wait: the late rank of each collective, the wait it caused, and what it
did before it came (``commdebug report``'s late ranks, ``check``'s header, the folder page's
"wait caused" view).

For a collective (group, sequence number) timed on every member of its group, the member with
the least latency arrived last: the others were already inside, waiting for it, so each waited
about its own latency minus that least one. Summed over the members that waited, that is the
wait the late rank *caused* at that call. All_to_all calls whose splits are uneven (or unknown)
are left out: their members' times differ by how much each moves, not only by when each came.

For a late call, the late rank's own *gap*: from the end of its previous collective (on any
group) to the start of this one, on its own host clock (no clock alignment needed; under
asynchronous timing an overlap counts 0), beside the mean gap of the members that waited, and
the two call sites around it (``after``: its previous call, ``before``: this one). Gaps are only
ever taken between two calls of one process: a rank's first recorded call has none (0). On a
GPU the host gap can be short while the GPU is late: ``gap_top``, the profiled ops of the gap,
shows it either way (a :data:`GapOps` function fills it; none: an empty list).

The root of a wait. The late rank L of a call C may itself have been held up: a rank that
waited in its pair group's call comes late to the next world call. So each late call is walked
back to its *root*, with what every dump holds (group, sequence number, latency, call order):
L *waited in* its previous call P when its latency there minus P's least is at least the
threshold; then the blame passes to P's late rank, at P. When L did not wait in P and its gap at
C exceeds the waiters' mean gap by less than the threshold, the walk goes back through L's own
earlier late calls (P, where L came last too) to the first whose gap difference reaches it. The
root is where the walk stops: the rank whose own work made it late, at its own call. Only roots
are listed; the waits passed on are counted to them (``chain_caused_s``, ``through``).

Start-up. A walk that ends at a rank's first recorded call (no call of its own before it: no
gap), or at a call before which it met nobody (its calls before were broadcasts, which a member
may leave before the others come: ops.needs_all), ends in the processes' start: they reach their
first collective, and their first meeting, at different moments.
That wait is *start-up skew* (:class:`StartupSkew`, listed on its own where someone waited over
the threshold), never a late rank, and it is in no rank's wait caused.

A (step, rank) pair is listed when, at one of its calls, some member waited for it longer than
the threshold (:class:`LateThreshold`: by default 50 ms, and 10% of the step's median
communication time, the median over ranks of each rank's time in collectives at that step), so
jitter names no rank. The longest single wait is held against the threshold, not the sum: the
sum grows with the group's size, and a thousand members each waiting a millisecond of jitter
are no late rank; the pairs are ordered by the sum, the whole wait caused.

Memory does not grow with the number of ranks: per group, per sequence number, flat arrays of
the least latency, the latency sum and maximum, the gap sum, the step, and the current late
rank's number, gap, start, call site and previous call, until every member of the group was
added (then a few bytes per call that made anyone wait); per rank, its table of call sites
(tuples shared between ranks), its spans of sequence numbers and its time per step. A rank's
:class:`LateDigest` (made by :func:`late_digest` in the worker that read it) holds the same
columns for its own calls, as flat arrays.

The analysis is in three parts: the results (here), one rank's digest
(:mod:`commdebug.analysis.late_digest`) and the merge of the digests
(:mod:`commdebug.analysis.late_tally`).

>>> tally = LateTally()
>>> for view in views:                       # doctest: +SKIP
...     tally.add(late_digest(view.rank, view.events))
>>> late = tally.result()                    # doctest: +SKIP
>>> late.entries[0].rank, late.entries[0].step, late.entries[0].worst.caused_s   # doctest: +SKIP
(3, 2, 2.41)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GapOps", "no_profile", "LateThreshold", "CallSite", "Passed", "LateCall", "LateRank", "StartupSkew", "LateRanks",
           "CALLS_KEPT"]

GapOps = Callable[[int, float, float], list[dict[str, Any]]]
"""What one rank ran between two moments of its own recording clock, from its profiled steps:
``(rank, gap start, gap end)`` (seconds from its recording's start) -> the top CPU ops or kernels
of that span, ``[{"name", "total_s", "count"}]``, most time first; [] where it was not profiled."""

CALLS_KEPT = 8  # a listed (step, rank)'s late calls kept, worst first (the folder page lists them)


def no_profile(rank: int, start_s: float, end_s: float) -> list[dict[str, Any]]:
    """The :data:`GapOps` of a folder without profiler traces: nothing is known of the gap."""
    return []


@dataclass(frozen=True)
class LateThreshold:
    """When a late call is worth naming: some member waited for it at least ``seconds``, and
    at least ``fraction`` of its step's median communication time (the median over ranks of
    each rank's time in collectives at that step)."""

    seconds: float = 0.05
    fraction: float = 0.10

    @classmethod
    def parse(cls, text: str) -> LateThreshold:
        """``"0.05"`` (seconds; the fraction stays 10%) or ``"0.05,10"`` / ``"0.05,10%"``
        (seconds, then a percentage); ValueError for anything else, or a negative number.

        >>> LateThreshold.parse("0.2,5%")
        LateThreshold(seconds=0.2, fraction=0.05)
        """
        head, _, tail = text.partition(",")
        seconds = float(head)
        fraction = float(tail.strip().removesuffix("%")) / 100 if tail.strip() else cls.fraction
        if not (0 <= seconds < float("inf") and 0 <= fraction < float("inf")):
            raise ValueError(text)
        return cls(seconds, fraction)

    def limit(self, step_median: float | None) -> float:
        """The least wait a call of a step with this median communication time must cause."""
        return max(self.seconds, self.fraction * step_median) if step_median is not None else self.seconds

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "fraction": self.fraction}


@dataclass(frozen=True)
class CallSite:
    """A call as a late entry names it: op, sequence number on its group, source line, module,
    and the group's label (None: not known)."""

    op: str
    seq: int | None
    source: str | None
    module: str | None
    group: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "seq": self.seq, "source": self.source, "module": self.module, "group": self.group}


@dataclass(frozen=True)
class Passed:
    """A call a wait passed through on its way from its root: its late rank came last there
    because it waited for the root (directly or through other calls), or because it was still
    late from an earlier call of its own."""

    group: str  # label
    seq: int
    op: str
    rank: int  # who came last there
    step: int
    source: str | None
    caused_s: float  # the wait it passed on there, summed over the members that waited

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "seq": self.seq, "op": self.op, "rank": self.rank, "step": self.step, "source": self.source,
                "caused_s": self.caused_s}


@dataclass(frozen=True)
class LateCall:
    """One call where a rank arrived last, and the wait that caused."""

    group: str  # label
    seq: int
    op: str
    caused_s: float  # summed over the members that waited
    max_wait_s: float  # the longest one member waited
    waited: int  # how many members waited (every other member of the group)
    module: str | None
    source: str | None
    gap_s: float | None  # the late rank's own time between its previous call's end and this call; None: unknown
    others_gap_s: float | None  # the same, averaged over the members that waited
    after: CallSite | None  # the late rank's previous call (None: this was its first)
    before: CallSite  # this call
    start_s: float | None = None  # when the late rank made the call, on its recording clock
    # the waits it caused here and downstream, summed over every call they passed through (None:
    # not walked yet), and those calls, nearest first
    chain_caused_s: float | None = None
    through: tuple[Passed, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "seq": self.seq, "op": self.op, "caused_s": self.caused_s, "max_wait_s": self.max_wait_s,
                "waited": self.waited, "module": self.module, "source": self.source, "gap_s": self.gap_s,
                "others_gap_s": self.others_gap_s, "after": None if self.after is None else self.after.to_dict(),
                "before": self.before.to_dict(),
                "chain_caused_s": self.caused_s if self.chain_caused_s is None else self.chain_caused_s,
                "through": [t.to_dict() for t in self.through]}


@dataclass
class LateRank:
    """A rank that made the others wait at one step, by its own work (a root, see the module
    docstring): its worst call there, the wait it caused at that step in all, the waits it
    passed on included (``step_caused_s``), and its late calls of the step whose waits passed
    the threshold (``calls``, worst first by the wait with what they passed on, at most
    :data:`CALLS_KEPT`)."""

    step: int
    rank: int
    worst: LateCall
    step_caused_s: float
    calls: list[LateCall]
    gap_top: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        w = self.worst.to_dict()
        return {"step": self.step, "rank": self.rank, "group": w["group"], "seq": w["seq"], "op": w["op"],
                "caused_s": w["caused_s"], "max_wait_s": w["max_wait_s"], "waited": w["waited"], "module": w["module"],
                "source": w["source"], "gap_s": w["gap_s"], "others_gap_s": w["others_gap_s"], "after": w["after"],
                "before": w["before"], "gap_top": self.gap_top, "step_caused_s": self.step_caused_s,
                "chain_caused_s": w["chain_caused_s"], "through": w["through"], "calls": [c.to_dict() for c in self.calls]}


@dataclass(frozen=True)
class StartupSkew:
    """The processes reaching their first collective at different moments: `rank` came last to
    its first recorded call, `skew_s` after rank `after` (the longest wait at that call, or at a
    call the wait was carried into, and the rank that waited it). ``first_call`` false: the call
    named is not `rank`'s first, but one before which no call had made it meet the others (its
    calls before were broadcasts or scatters, whose members need not meet)."""

    rank: int
    group: str  # label
    seq: int
    op: str
    source: str | None
    step: int
    skew_s: float
    after: int  # the rank that waited longest: it came first
    first_call: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "group": self.group, "seq": self.seq, "op": self.op, "source": self.source, "step": self.step,
                "skew_s": self.skew_s, "after_rank": self.after, "first_call": self.first_call}


@dataclass
class LateRanks:
    """The analysis over a folder: the listed (step, rank) pairs worst first, and every rank's
    wait caused, in all (``caused_by_rank``) and per step (``by_step``: (step, rank) -> seconds),
    start-up apart (``startup``, worst first: in neither)."""

    entries: list[LateRank]
    threshold: LateThreshold
    analysed: int  # calls timed on every member
    caused_by_rank: dict[int, float] = field(default_factory=dict)
    by_step: dict[tuple[int, int], float] = field(default_factory=dict)
    timed: bool = False  # some rank timed a call with a sequence number
    partial: int = 0  # calls timed on only some members of their group (left out)
    gaps_known: bool = True  # False: some call's start times were not recorded (Flight Recorder)
    startup: list[StartupSkew] = field(default_factory=list)

    def to_dict(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.entries]

    def startup_to_dict(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.startup]
