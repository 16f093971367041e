"""The root of each wait (:mod:`commdebug.analysis.late`): a late call walked back, through the
calls its late rank made before, to the rank whose own work made it late, or to the processes'
start.

The walk reads only what the late-rank analysis keeps of a call whose longest wait reached the
threshold's seconds (a :class:`Record`, made when its group settles), and the least latency of
any call (the merge keeps that for every call). From a record, with L its late rank and P the
call L made before it (on any group):

- no P (L's first recorded call): the walk ends in *start-up* (where L's recording began with its
  process; else nowhere: :data:`CUT`);
- L *waited in* P (its latency there minus P's least is at least the threshold at P's step): the
  blame passes to P's late rank, at P (P's record);
- else, L's gap before the call exceeds the waiters' mean gap by the threshold: L's own work made
  it late here, the root;
- else, L came last at P too: L was already late, the walk goes on at P;
- else the walk ends here (what came before is not known well enough to go further).

Each record's walk is followed once: a walk that meets a record already walked takes its root.

>>> kinds = walk(records, tally.least_at, lambda step: 0.05, cut=set())   # doctest: +SKIP
>>> kinds[0]
('late', 3, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

from commdebug.analysis.late import LateCall

__all__ = ["Record", "walk", "LATE", "STARTUP", "CUT"]

LATE, STARTUP, CUT = "late", "startup", "cut"  # where a walk ends: a rank's own work, the processes' start, or
# a first call whose rank's recording did not begin with its process (events dropped before it): neither


class Record(NamedTuple):
    """A call whose longest wait reached the threshold's seconds: what its root is found from."""

    step: int
    rank: int  # the late one
    caused: float
    group: str  # name
    seq: int
    longest: float  # the longest single wait
    call: LateCall
    prev_group: str | None  # the late rank's call before this one: its group (None: none, untimed or unnumbered),
    prev_seq: int  # its number (-1: none)
    prev_lat: float  # and the late rank's latency there (-1: none)
    most_rank: int  # the member that waited longest (it came first)
    first: bool  # the late rank had no call before this one


def walk(records: Sequence[Record], least_at: Callable[[str, int], float | None], limit: Callable[[int], float],
         cut: Collection[int]) -> list[tuple[str, int, int]]:
    """Per record, where its walk ends: (:data:`LATE`, :data:`STARTUP` or :data:`CUT`, the index
    of the root's record, the calls between them). `least_at(group, seq)`: a call's least
    latency (None: not known); `limit(step)`: the threshold at a step; `cut`: the ranks whose
    recording did not begin with their process."""
    at = {(r.group, r.seq): k for k, r in enumerate(records)}
    ends: list[tuple[str, int, int] | None] = [None] * len(records)

    def step(k: int) -> tuple[int | None, str]:
        """The record the walk goes on to from record `k`, or None and how it ends."""
        r = records[k]
        if r.first:
            return None, CUT if r.rank in cut else STARTUP
        before = at.get((r.prev_group, r.prev_seq)) if r.prev_group is not None and r.prev_seq >= 0 else None
        if r.prev_group is not None and r.prev_seq >= 0 and r.prev_lat >= 0:
            least = least_at(r.prev_group, r.prev_seq)
            if least is not None and r.prev_lat - least >= limit(records[before].step if before is not None else r.step):
                return before, LATE  # it waited there: the one it waited for (unknown: the walk ends here)
        gap, others = r.call.gap_s, r.call.others_gap_s
        if gap is not None and others is not None and gap - others >= limit(r.step):
            return None, LATE  # its own work before the call made it late
        if before is not None and records[before].rank == r.rank:
            return before, LATE  # late already: it came last at its call before too
        return None, LATE

    for start in range(len(records)):
        path: list[int] = []
        seen: set[int] = set()
        k: int | None = start
        kind, root, hops = LATE, start, -1
        while True:
            assert k is not None
            known = ends[k]
            if known is not None:
                kind, root, hops = known
                break
            path.append(k)
            seen.add(k)
            nxt, kind = step(k)
            if nxt is None or nxt in seen:  # a loop (dumps that disagree) ends where it closes
                root, hops = k, -1
                break
            k = nxt
        for k in reversed(path):
            hops += 1
            ends[k] = (kind, root, hops)
    return [e for e in ends if e is not None]
