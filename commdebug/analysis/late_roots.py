"""The root of each wait (:mod:`commdebug.analysis.late`): a late call walked back, through the
calls its late rank made before, to the rank whose own work made it late, or to the processes'
start.

The walk reads only what the late-rank analysis keeps of a call whose longest wait reached the
threshold's seconds, or among its late rank's first calls (a :class:`Record`, made when its
group settles), and the least latency of any call (the merge keeps that for every call). From a
record, with L its late rank and P the call L made before it (on any group):

- no P (L's first recorded call), or no call before it that made L meet anyone (every one of them
  a broadcast, whose members need not meet: L came as it started, and its gap there runs from
  a call the others left at other moments): the walk ends in *start-up* (where L's recording
  began with its process; else nowhere: :data:`CUT`);
- a wait shorter than the threshold's seconds goes no further back (jitter is passed on by
  nobody), but for start-up carried on (the last point);
- L *waited in* P (its latency there minus P's least is at least the threshold at P's step): the
  blame passes to P's late rank, at P (P's record);
- else, L's gap before the call exceeds the waiters' mean gap by the threshold: L's own work made
  it late here, the root;
- else, L came last at P too, and someone waited the threshold's seconds for it there: L was
  already late, the walk goes on at P;
- else the walk ends here, for want of a cause; but among L's first calls, where P was L's first
  call or P's walk ends in start-up, and L and the others did not leave P together (P's group
  lacks some of them, or P's op lets a member finish before all arrived: a rooted broadcast),
  the wait is start-up carried on (the rank's start made it late), and so is every wait whose
  walk ended here.

Each record's walk is followed once: a walk that meets a record already walked takes its root.

>>> kinds = walk(records, tally.least_at, lambda step: 0.05, cut=set(), early=16, floor=0.05)   # doctest: +SKIP
>>> kinds[0]
('late', 3, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple

from commdebug.analysis.late import LateCall
from commdebug.ops import needs_all

__all__ = ["Record", "walk", "LATE", "STARTUP", "CUT"]

LATE, STARTUP, CUT = "late", "startup", "cut"  # where a walk ends: a rank's own work, the processes' start, or
# a first call whose rank's recording did not begin with its process (events dropped before it): neither


class Record(NamedTuple):
    """A call whose longest wait reached the threshold's seconds, or among its late rank's first
    calls (:data:`commdebug.analysis.late_tally.EARLY`): what its root is found from."""

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
    ordinal: int  # the call's place among the late rank's calls (0: its first)
    met: bool = True  # the late rank made a call before this one that made its members meet (ops.needs_all)


def walk(records: list[Record], least_at: Callable[[str, int], float | None], limit: Callable[[int], float],
         cut: Collection[int], early: int, floor: float, members: Mapping[str, frozenset[int]]) -> list[tuple[str, int, int]]:
    """Per record, where its walk ends: (:data:`LATE`, :data:`STARTUP` or :data:`CUT`, the index
    of the root's record, the calls between them). `least_at(group, seq)`: a call's least
    latency (None: not known); `limit(step)`: the threshold at a step; `cut`: the ranks whose
    recording did not begin with their process; `early`: how many of a rank's first calls
    start-up can carry on into; `floor`: the threshold's seconds, the least longest wait that is
    walked back through the calls before (a shorter one is jitter, or start-up carried on). A
    start-up root that is no record (a rank's first call where nobody waited) is appended to
    `records`. `members`: each group's ranks, where known (start-up cannot carry on from a call
    whose group holds every member of the next: they all left it together)."""
    at = {(r.group, r.seq): k for k, r in enumerate(records)}

    def before(r: Record) -> int | None:
        return at.get((r.prev_group, r.prev_seq)) if r.prev_group is not None and r.prev_seq >= 0 else None

    def step(k: int) -> tuple[int | None, str, bool]:
        """The record the walk goes on to from record `k`, or None, how it ends, and whether it
        ended for want of a cause (no wait passed on, no long gap of its own, not late before)."""
        r = records[k]
        if r.first or not r.met:
            return None, CUT if r.rank in cut else STARTUP, False
        p = before(r)
        if r.longest < floor:
            return None, LATE, True
        if r.prev_group is not None and r.prev_seq >= 0 and r.prev_lat >= 0:
            least = least_at(r.prev_group, r.prev_seq)
            if least is not None and r.prev_lat - least >= limit(records[p].step if p is not None else r.step):
                return p, LATE, False  # it waited there: the one it waited for (unknown: the walk ends here)
        gap, others = r.call.gap_s, r.call.others_gap_s
        if gap is not None and others is not None and gap - others >= limit(r.step):
            return None, LATE, False  # its own work before the call made it late
        if p is not None and records[p].rank == r.rank and records[p].longest >= floor:
            return p, LATE, False  # late already: it came last at its call before too, and long enough to count
        return None, LATE, True

    ends: list[tuple[str, int, int] | None] = [None] * len(records)
    idle: set[int] = set()  # roots where a walk ended for want of a cause
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
            nxt, kind, wanting = step(k)
            if nxt is None or nxt in seen:  # a loop (dumps that disagree) ends where it closes
                root, hops = k, -1
                if wanting:
                    idle.add(k)
                break
            k = nxt
        for k in reversed(path):
            hops += 1
            ends[k] = (kind, root, hops)
    _carry_start_up(records, ends, idle, before, cut, early, members)
    return [e for e in ends if e is not None]


def _carry_start_up(records: list[Record], ends: list[tuple[str, int, int] | None], idle: set[int],
                    before: Callable[[Record], int | None], cut: Collection[int], early: int,
                    members: Mapping[str, frozenset[int]]) -> None:
    """Start-up carried on: a root among its rank's first `early` calls that had no cause of its
    own is start-up where its rank's call before it, on a group that does not hold every member
    of this one (they did not all leave it together), was its first, or was a call whose walk
    ends in start-up; then so is every call whose walk ended at it. In place, until nothing
    changes (each change turns a late root into start-up, so it ends)."""

    def together(r: Record) -> bool:
        """Whether every member of `r`'s call left the call before it (its late rank's) together:
        that call's group holds every member of this one, and no member's call of its op can end
        before all arrived (ops.needs_all). A broadcast's root and its receivers need not meet:
        a rank that started late finds its data there and goes on as late as it came."""
        if r.call.after is not None and not needs_all(r.call.after.op):
            return False
        if r.prev_group == r.group:
            return True
        mine, theirs = members.get(r.group), members.get(r.prev_group or "")
        return mine is not None and theirs is not None and mine <= theirs

    by_root: dict[int, list[int]] = {}  # each root's records
    for j, e in enumerate(ends):
        if e is not None:
            by_root.setdefault(e[1], []).append(j)
    changed = True
    while changed:  # a pass per round of changes: a root turned start-up can make another one so
        changed = False
        for k in sorted(idle, key=lambda k: records[k].ordinal):
            r = records[k]
            if r.ordinal >= early or r.prev_group is None or together(r):
                continue
            p = before(r)
            if p is not None and (e := ends[p]) is not None and e[0] in (STARTUP, CUT):
                kind, root, hops = e
            elif r.ordinal == 1 and r.call.after is not None:
                kind, root, hops = CUT if r.rank in cut else STARTUP, len(records), 0
                records.append(_first_call(r))
                ends.append((kind, root, 0))
                by_root[root] = [root]
            else:
                continue
            moved = by_root.pop(k, [])
            for j in moved:
                old = ends[j]
                assert old is not None
                ends[j] = (kind, root, hops + 1 + old[2])
            by_root.setdefault(root, []).extend(moved)
            idle.discard(k)
            changed = True


def _first_call(r: Record) -> Record:
    """A record of the call before `r` on its late rank, that rank's first: nobody waited there."""
    after = r.call.after
    assert after is not None
    call = LateCall(after.group or "?", after.seq if after.seq is not None else -1, after.op, 0.0, 0.0, 0, after.module, after.source,
                    None, None, None, after)
    return Record(r.step, r.rank, 0.0, r.prev_group or "?", r.prev_seq, 0.0, call, None, -1, -1.0, -1, True, 0, False)
