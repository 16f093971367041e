"""The merge of the ranks' late-rank digests (:mod:`commdebug.analysis.late`): one pass over
them, memory that does not grow with the number of ranks, then the listed (step, rank) pairs.

A rank's calls are compared with its group members' before it when it is added: the least
latency of each call so far (and where the rank took it, it arrived last: its rank, gap and
what names the call and the call before it are read from its digest there and then, so no
digest is kept), and the largest one and who took it. The sums over the members, of the latencies and of the gaps, are taken a batch
of members at a time (:data:`BATCH`, a column across them); only those two columns of a member
wait for its batch.

Once every member of a group was added (its size is known and that many ranks brought calls on
it), its share of the result is taken and its columns freed but the least latencies: per call
that made anyone wait, 16 bytes (step, late rank, wait caused), not the 92 of its columns; per
call whose longest wait reaches the threshold's seconds, or that is among its late rank's first
:data:`EARLY` calls (where start-up can carry on), a record of what the late rank did before it
(its previous call's group, number and its latency there). Those shares are summed
into the result in the order the groups were first summed in, whenever they were settled, so
each (step, rank)'s wait is the same sum, to the bit, as if every group had waited for the end.
A rank that brings calls on a group already settled (more members than the group's size, which
a consistent job never has) has those calls counted as left out.

At the end each recorded call is walked back to its root (:mod:`commdebug.analysis.late`'s
docstring): through the previous call of its late rank, looked up by (group, number) among the
records, and that call's least latency. The waits of the recorded calls are then added to their
roots' (step, rank), in the records' order; a wait whose root is start-up is added nowhere.

Where :mod:`commdebug.analysis._late` is built, each member's comparison and sums are one pass
in C; else the same operations in Python, in the same order (the same bits)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import replace
from itertools import accumulate, compress, repeat
from operator import (
    add as _add,
    and_ as _and,
    eq as _eq,
    ge as _ge,
    gt as _gt,
    lt as _lt,
    mul as _mul,
    or_ as _or,
    sub as _sub,
)
from typing import NamedTuple

from commdebug.analysis.divergence import Interner
from commdebug.analysis.late import (
    CALLS_KEPT,
    CallSite,
    GapOps,
    LateCall,
    LateRank,
    LateRanks,
    LateThreshold,
    Passed,
    StartupSkew,
)
from commdebug.analysis.late_digest import GroupPart, LateDigest, step_medians
from commdebug.analysis.late_roots import CUT, LATE, STARTUP, Record, walk

try:  # the passes in C: optional (setup.py), the same results without it
    import commdebug.analysis._late as _late
except ImportError:  # pragma: no cover - no C compiler at install
    _late = None  # type: ignore[assignment]

__all__ = ["LateTally", "BATCH", "PENDING"]

BATCH = 8  # a group's members whose sums are taken together (column by column across them, in C)
EARLY = 16  # a late rank's first calls whose waits are walked to their roots however short: start-up can carry on into them
PENDING = 256  # (rank, group) shares waiting in unfinished batches, at most: memory stays bounded

_INF = float("inf")

# a group's per-call columns: name, array type, value before any member brought the call
_COLUMNS = (("least", "d", _INF), ("total", "d", 0.0), ("most", "d", 0.0), ("gaps", "d", 0.0), ("step", "i", -1),
            ("skip", "b", 0), ("rank", "i", -1), ("gap", "d", 0.0), ("site", "i", 0), ("prev_site", "i", -1),
            ("prev_seq", "q", -1), ("prev_group", "i", -1), ("prev_lat", "d", -1.0), ("most_rank", "i", -1), ("ordinal", "q", -1))
_START = ("start", "d", 0.0)  # only where a profile can tell what the late rank ran in its gap (GapOps)


class _Calls:
    """One group's calls, by sequence number from ``base``: the analysis's flat arrays."""

    __slots__ = ("base", "label", "size", "ranks", "runs", "gaps_known", "columns", "settled", *(c[0] for c in _COLUMNS), _START[0])

    def __init__(self, base: int, label: str, size: int, starts: bool) -> None:
        self.base, self.label, self.size = base, label, size
        self.ranks: set[int] = set()  # the members seen (the group's size when it is unknown)
        self.runs: list[int] = []  # first, last, first, last...: every rank's spans of sequence numbers
        self.gaps_known = True
        self.settled: _Settled | None = None  # its share of the result, once every member was added
        self.columns = (*_COLUMNS, _START) if starts else _COLUMNS
        # least, total, most: of the members' latencies; gaps: their sum; the step; whether to skip the call (an uneven all_to_all);
        # the member with the least latency so far: its rank, gap, call site, its previous call's
        # site (-1: none), number (-1: none, or a send or receive), group (-1: none) and its
        # latency there (-1: none), the call's place among its calls, its start; the member that took ``most``
        self.least, self.total, self.most, self.gaps = array("d"), array("d"), array("d"), array("d")
        self.step, self.skip = array("i"), array("b")
        self.rank, self.gap, self.site, self.prev_site, self.prev_seq = array("i"), array("d"), array("i"), array("i"), array("q")
        self.prev_group, self.prev_lat, self.most_rank, self.ordinal = array("i"), array("d"), array("i"), array("q")
        self.start = array("d")

    def cover(self, first: int, last: int) -> list[int]:
        """Make room for sequence numbers first..last: the range of the new ones (from, to),
        which take their steps from the rank that brought them."""
        new: list[int] = []
        if not self.least:
            self.base = first
        elif first < self.base:
            grow = self.base - first
            for name, kind, empty in self.columns:
                setattr(self, name, array(kind, [empty]) * grow + getattr(self, name))
            self.base = first
            new += (0, grow)
        end = last - self.base + 1
        have = len(self.least)
        if end > have:
            grow = end - have
            for name, kind, empty in self.columns:
                getattr(self, name).extend(array(kind, [empty]) * grow)
            new += (have, end)
        return new


class _Settled(NamedTuple):
    """A group's share of the result, taken once every member was added (and its columns but
    ``least`` freed): per call that made anyone wait, in sequence order, its step, its late rank
    and the wait caused, but the calls recorded for their roots (``found``) and those of a late
    rank at its first call; how many calls were analysed and left out."""

    steps: array  # i
    ranks: array  # i
    caused: array  # d
    found: list[Record]
    analysed: int
    partial: int





class _Share(NamedTuple):
    """A member's latencies and gaps on one group, waiting in a batch to be summed: of the
    calls `first` to `first` + n - 1 (a run), or else of `seqs`."""

    first: int
    lats: array
    gaps: array | None
    seqs: array | None  # None: a run


class LateTally:
    """The late-rank analysis in one pass over the ranks' digests (see the module docstring).
    `threshold`: when a late rank is listed; `gap_ops`: what a late rank ran in its gap, from
    profiled steps (:data:`commdebug.analysis.late.GapOps`; none: ``gap_top`` stays empty)."""

    def __init__(self, threshold: LateThreshold | None = None, gap_ops: GapOps | None = None) -> None:
        self.threshold = threshold or LateThreshold()
        self.gap_ops = gap_ops
        self._calls: dict[str, _Calls] = {}  # by group, made by its first member
        # the same, in the order their first sums were taken: the order the waits are summed in
        self.groups: dict[str, _Calls] = {}
        self.sites = Interner()  # (op, module, source) by id
        self.group_ids = Interner()  # group names by id: what a call's previous call's group is kept as
        self.cut: set[int] = set()  # ranks whose first recorded event is not their recording's first
        self.members: dict[str, frozenset[int]] = {}  # each group's ranks, where a dump names them
        self.step_times: dict[int, tuple[array, array]] = {}
        self.timed = False
        self.gaps_known = True
        self._pending: dict[str, list[_Share]] = {}  # group -> members whose sums wait for the batch
        self._waiting = 0
        # the settled groups' shares, summed in the order of ``groups`` as far as every group is settled
        self._by_step: dict[tuple[int, int], float] = {}
        self._found: list[Record] = []
        self._analysed = self._partial = 0
        self._summed = 0  # the groups summed so far, the first ones of ``groups``
        self._result: LateRanks | None = None
        self._ints: list[int] = []  # 0, 1, 2...: the ranks' numbers, one object each for every (step, rank) key
        self.first_meeting: dict[int, int] = {}  # rank -> LateDigest.first_meeting

    def add(self, d: LateDigest) -> None:
        """One rank's digest: its calls compared with its group members' before it at once, its
        latencies and gaps waiting for up to :data:`BATCH` members of the group to be summed
        together (see the module docstring)."""
        if d.timed:
            self.timed = True
            self.step_times[d.rank] = (d.step_list, d.step_times)
        if not d.groups:
            return
        if d.rank >= len(self._ints):
            self._ints += range(len(self._ints), d.rank + 1)
        if d.groups[0].gaps is None:  # no start times (all its groups alike)
            self.gaps_known = False
        if not d.whole:
            self.cut.add(d.rank)
        self.first_meeting[d.rank] = d.first_meeting
        here = array("i", self.sites.many(d.table))  # the rank's site ids -> ours
        gids = array("i", self.group_ids.many(p.name for p in d.groups))  # its group indices -> our group ids
        complete = []
        for part in d.groups:
            c = self._calls.get(part.name)
            if c is not None and c.settled is not None:  # more members than the group's size: left out
                self._partial += len(part.seqs)
                continue
            c = self._compare(d.rank, part, here, gids)
            if part.members and part.name not in self.members:
                self.members[part.name] = frozenset(part.members)
            batch = self._pending.setdefault(part.name, [])
            batch.append(_Share(part.seqs[0], part.lats, part.gaps, None if part.run else part.seqs))
            self._waiting += 1
            if len(batch) >= min(part.size or BATCH, BATCH):
                self._flush(part.name)
            if c.size and len(c.ranks) >= c.size:
                complete.append(part.name)
        for name in complete:  # its last batch can take no other member: summed now, and the group settled
            if name in self._pending:
                self._flush(name)
            self._settle(name)
        if complete:
            self._sum_settled()
        if self._waiting > PENDING:
            self.flush()

    def flush(self) -> None:
        """Sum every member waiting in a batch."""
        for name in list(self._pending):
            self._flush(name)

    def _flush(self, name: str) -> None:
        batch = self._pending.pop(name)
        self._waiting -= len(batch)
        c = self.groups[name] = self._calls[name]
        p0 = batch[0]
        n, first = len(p0.lats), p0.first
        if len(batch) == 1 or not all(p.seqs is None and len(p.lats) == n and p.first == first and (p.gaps is None) == (p0.gaps is None)
                                      for p in batch):
            for p in batch:
                self._sum(c, p)
            return
        # members with the same calls (the same run of sequence numbers): summed across them first,
        # left to right (the same sums in C and in Python), then added to the calls' sums
        lo = first - c.base
        _add_batch(c.total, lo, [p.lats for p in batch])
        if p0.gaps is not None:
            _add_batch(c.gaps, lo, [p.gaps for p in batch])  # type: ignore[misc]

    @staticmethod
    def _sum(c: _Calls, p: _Share) -> None:
        """One member's latencies and gaps added to its calls' sums."""
        first, lats, gaps, seqs = p
        if seqs is None:
            lo = first - c.base
            _add_batch(c.total, lo, [lats])
            if gaps is not None:
                _add_batch(c.gaps, lo, [gaps])
            return
        base, total, sums = c.base, c.total, c.gaps
        for j, seq in enumerate(seqs):
            total[seq - base] += lats[j]
            if gaps is not None:
                sums[seq - base] += gaps[j]

    def _compare(self, rank: int, part: GroupPart, here: array, gids: array) -> _Calls:
        """A member's calls against its group members' before it: the least and the largest
        latency of each (and who took that), and where it is the least so far (it arrived last),
        its rank and what names the call and the call before it. `here`: the rank's site ids as
        ours; `gids`: its group indices as our group ids."""
        seqs, lats, gaps = part.seqs, part.lats, part.gaps
        n = len(seqs)
        c = self._calls.get(part.name)
        if c is None:
            c = self._calls[part.name] = _Calls(min(seqs), part.label, part.size, self.gap_ops is not None)
        elif part.size > c.size:
            c.size = part.size
        c.ranks.add(rank)
        if gaps is None:
            c.gaps_known = False
        first, last = (seqs[0], seqs[-1]) if part.run else (min(seqs), max(seqs))
        new = c.cover(first, last)
        base = c.base
        if new:  # the calls first seen here take this rank's steps
            steps = part.steps
            if part.run:
                for a, b in zip(new[::2], new[1::2], strict=True):
                    a, b = max(a, first - base), min(b, last - base + 1)
                    if a < b:
                        c.step[a:b] = array("i", steps[a + base - first:b + base - first])
            else:
                step = c.step
                for seq, s in zip(seqs, steps, strict=True):
                    if step[seq - base] < 0:
                        step[seq - base] = s
        for seq in part.uneven:
            c.skip[seq - base] = 1
        if not part.run:  # out of order or with holes: a call at a time
            self._compare_calls(c, rank, part, here, gids)
            return c
        c.runs += (first, last)
        lo = first - base
        starts = part.starts if self.gap_ops is not None else None
        if _late is not None:  # the same comparisons, in one pass in C
            _late.merge((c.least, c.most, c.rank, c.site, c.prev_site, c.prev_seq, c.gap, c.start if starts is not None else None,
                         c.prev_group, c.prev_lat, c.most_rank, c.ordinal),
                        lo, rank, (lats, gaps, part.sites, part.prev_sites, part.prev_seqs, starts, part.prev_groups, part.prev_lats,
                                   part.ordinals),
                        here, gids)
            return c
        hi = lo + n
        worse = list(map(_gt, lats, c.most[lo:hi]))
        if False not in worse:
            c.most[lo:hi] = lats
            c.most_rank[lo:hi] = array("i", [rank]) * n
        elif True in worse:
            most, most_rank = c.most, c.most_rank
            for j in compress(range(n), worse):
                most[lo + j] = lats[j]
                most_rank[lo + j] = rank
        better = list(map(_lt, lats, c.least[lo:hi]))
        if False not in better:  # the first member here (or the last to come everywhere): a slice at a time
            ids = [*here, -1]  # ours, and -1 for none (a first call's previous site)
            c.least[lo:hi] = lats
            c.rank[lo:hi] = array("i", [rank]) * n
            c.site[lo:hi] = array("i", map(ids.__getitem__, part.sites))
            c.prev_site[lo:hi] = array("i", map(ids.__getitem__, part.prev_sites))
            c.prev_seq[lo:hi] = part.prev_seqs
            c.prev_group[lo:hi] = array("i", map([*gids, -1].__getitem__, part.prev_groups))
            c.prev_lat[lo:hi] = part.prev_lats
            c.ordinal[lo:hi] = part.ordinals
            if gaps is not None:
                c.gap[lo:hi] = gaps
                if starts is not None:
                    c.start[lo:hi] = starts
        elif True in better:
            js = list(compress(range(n), better))
            self._won(c, rank, [lo + j for j in js], js, part, here, gids)
        return c

    def _compare_calls(self, c: _Calls, rank: int, part: GroupPart, here: array, gids: array) -> None:
        """:meth:`_compare` for calls out of order or with holes, a call at a time."""
        base, lats = c.base, part.lats
        runs: list[int] = []
        ks, js = [], []
        for j, seq in enumerate(part.seqs):
            if runs and runs[-1] + 1 == seq:
                runs[-1] = seq
            elif not runs or runs[-1] != seq:  # a repeated number counts once
                runs += (seq, seq)
            k = seq - base
            lat = lats[j]
            if lat > c.most[k]:
                c.most[k] = lat
                c.most_rank[k] = rank
            if lat < c.least[k]:
                c.least[k] = lat
                ks.append(k)
                js.append(j)
        c.runs += runs
        if ks:
            self._won(c, rank, ks, js, part, here, gids)

    def _won(self, c: _Calls, rank: int, ks: list[int], js: list[int], part: GroupPart, here: array, gids: array) -> None:
        """Rank `rank` has the least latency so far at indices `ks` (its calls `js` of the
        group): it is the late one there, until a later rank comes later still. What names
        each call is copied from the same place of the rank's columns."""
        ids = [*here, -1]  # ours, and -1 for none (a first call's previous site)
        groups = [*gids, -1]
        lats, gaps, sites, prev_sites, prev_seqs = part.lats, part.gaps, part.sites, part.prev_sites, part.prev_seqs
        least, ranks, site, prev, prev_seq, gap = c.least, c.rank, c.site, c.prev_site, c.prev_seq, c.gap
        prev_group, prev_lat, ordinal = c.prev_group, c.prev_lat, c.ordinal
        for k, j in zip(ks, js, strict=True):
            least[k] = lats[j]
            ranks[k] = rank
            site[k] = ids[sites[j]]
            prev[k] = ids[prev_sites[j]]
            prev_seq[k] = prev_seqs[j]
            prev_group[k] = groups[part.prev_groups[j]]
            prev_lat[k] = part.prev_lats[j]
            ordinal[k] = part.ordinals[j]
        if gaps is None:
            return
        for k, j in zip(ks, js, strict=True):
            gap[k] = gaps[j]
        starts = part.starts
        if self.gap_ops is not None and starts is not None:
            start = c.start
            for k, j in zip(ks, js, strict=True):
                start[k] = starts[j]

    def least(self, name: str) -> tuple[int, array]:
        """The least latency any member took at each call of group `name`, over the ranks
        added so far, from its first sequence number on: (that number, the latencies)."""
        c = self._calls[name]
        return c.base, c.least

    def step_medians(self) -> dict[int, float]:
        """Per step, the median over ranks of each rank's time in collectives there."""
        return step_medians(list(self.step_times.values()))

    def result(self, medians: dict[int, float] | None = None) -> LateRanks:
        """The :class:`LateRanks` of every rank added (once, after the last :meth:`add`; a
        second call gives the same). `medians`: the steps' median communication times, when
        the caller has them (:meth:`step_medians`)."""
        if self._result is not None:
            return self._result
        self.flush()
        for name, c in self.groups.items():
            if c.settled is None:
                self._settle(name)
        self._sum_settled()
        threshold = self.threshold
        medians = self.step_medians() if medians is None else medians

        def limit(step: int) -> float:
            return threshold.limit(medians.get(step))

        out = self._result = LateRanks([], threshold, self._analysed, timed=self.timed, gaps_known=self.gaps_known,
                                       partial=self._partial)
        out.by_step = by_step = self._by_step
        found = self._found
        # (appends the start-up roots that are no record)
        roots = walk(found, self.least_at, limit, self.cut, EARLY, threshold.seconds, self.members)
        chains: dict[int, list[tuple[Record, int]]] = {}  # a root's index in ``found`` -> its chain, with each call's hops from it
        for f, (kind, root, hops) in zip(found, roots, strict=True):
            if kind == CUT:
                continue
            chains.setdefault(root, []).append((f, hops))
            if kind == LATE:  # the wait counts to the root's (step, rank), in the records' order
                key = (found[root].step, self._ints[found[root].rank])
                by_step[key] = by_step.get(key, 0.0) + f.caused
        by_rank = out.caused_by_rank
        for (_, rank), cause in by_step.items():
            by_rank[rank] = by_rank.get(rank, 0.0) + cause
        per_pair: dict[tuple[int, int], list[LateCall]] = {}
        for root, chain in chains.items():
            r = found[root]
            if roots[root][0] == STARTUP:
                # the longest wait at the first call or at a call it was carried into, and who waited it
                at = max(chain, key=lambda x: x[0].longest)[0]
                if at.longest >= limit(at.step):
                    out.startup.append(StartupSkew(r.rank, r.call.group, r.seq, r.call.op, r.call.source, r.step, at.longest,
                                                   at.most_rank, r.first))
                continue
            if not any(f.longest >= limit(f.step) for f, _ in chain):
                continue
            passed = sorted((x for x in chain if x[0] is not r), key=lambda x: (x[1], x[0].step, x[0].group, x[0].seq))
            total = 0.0
            for f, _ in chain:
                total += f.caused
            call = replace(r.call, chain_caused_s=total,
                           through=tuple(Passed(f.call.group, f.seq, f.call.op, f.rank, f.step, f.call.source, f.caused) for f, _ in passed))
            per_pair.setdefault((r.step, r.rank), []).append(call)
        for (step, rank), calls in per_pair.items():
            calls.sort(key=lambda c: (-(c.chain_caused_s or 0.0), c.group, c.seq))
            late = calls[:CALLS_KEPT]
            entry = LateRank(step, rank, late[0], by_step[(step, rank)], late)
            w = late[0]
            if self.gap_ops is not None and w.gap_s is not None and w.start_s is not None:
                entry.gap_top = self.gap_ops(rank, w.start_s - w.gap_s, w.start_s)
            out.entries.append(entry)
        out.entries.sort(key=lambda e: (-(e.worst.chain_caused_s or 0.0), e.step, e.rank))
        out.startup.sort(key=lambda s: (-s.skew_s, s.rank, s.group, s.seq))
        return out

    def least_at(self, name: str, seq: int) -> float | None:
        """The least latency any member took at call `seq` of group `name`; None: not known."""
        c = self._calls.get(name)
        if c is None or not c.base <= seq < c.base + len(c.least):
            return None
        least = c.least[seq - c.base]
        return None if least == _INF else least

    def _settle(self, name: str) -> None:
        """Group `name`'s share of the result (:class:`_Settled`), taken from its columns, which
        are then freed but ``least`` (:meth:`least` reads it): once every member was added, or
        at the end."""
        c = self._calls[name]
        size = c.size or len(c.ranks)
        floor = self.threshold.seconds
        if _late is not None:  # the same, in one pass in C
            steps, ranks, caused, worth, analysed, partial = _late.settle(
                (c.total, c.least, c.most, c.step, c.rank, c.skip, c.prev_site, c.ordinal), c.runs, c.base, size, floor, EARLY)
            c.settled = _Settled(steps, ranks, caused, [self._record(name, i, cause) for i, cause in worth], analysed, partial)
        else:
            c.settled = self._settle_python(name, c, size, floor)
        for column, kind, _ in c.columns:
            if column != "least":
                setattr(c, column, array(kind))

    def _settle_python(self, name: str, c: _Calls, size: int, floor: float) -> _Settled:
        """:meth:`_settle`'s share, a column at a time in Python."""
        count = _counts(c.runs, c.base, len(c.least))
        complete = list(map(_eq, count, repeat(size)))
        if True in c.skip:
            complete = list(map(_and, complete, map(_eq, c.skip, repeat(0))))
        partial = len(count) - count.count(0) - count.count(size)
        if size < 2:
            return _Settled(array("i"), array("i"), array("d"), [], 0, partial)
        caused = list(map(_sub, c.total, map(_mul, count, c.least)))
        # the calls that made anyone wait (float noise aside: every member came at once)
        at = list(compress(range(len(count)), map(_and, complete, map(_gt, caused, repeat(1e-12)))))
        # the ones recorded for their roots: the longest single wait is the threshold's seconds or
        # more, or the call is among its late rank's first EARLY (a wait carried on from the start)
        most, least = c.most, c.least
        worth = list(map(_or, map(_ge, map(_sub, map(most.__getitem__, at), map(least.__getitem__, at)), repeat(floor)),
                         map(_lt, map(c.ordinal.__getitem__, at), repeat(EARLY))))
        found = [self._record(name, i, caused[i]) for i in compress(at, worth)]
        # the others, but those of a late rank at its first call (no gap: start-up)
        rest = [i for i, w in zip(at, worth, strict=True) if not w and c.prev_site[i] >= 0]
        return _Settled(array("i", map(c.step.__getitem__, rest)), array("i", map(c.rank.__getitem__, rest)),
                        array("d", map(caused.__getitem__, rest)), found, complete.count(True), partial)

    def _sum_settled(self) -> None:
        """The settled groups' shares added to the result's sums, in the order of ``groups`` (the
        order the waits of a (step, rank) are summed in, so that the sums do not depend on when
        each group was settled), up to the first group not settled yet."""
        order = list(self.groups.values())
        by_step = self._by_step
        get = by_step.get
        while self._summed < len(order) and (s := order[self._summed].settled) is not None:
            self._summed += 1
            self._analysed += s.analysed
            self._partial += s.partial
            if _late is not None:
                _late.fold(by_step, s.steps, s.ranks, s.caused, self._ints)
            else:
                for key, cause in zip(zip(s.steps, map(self._ints.__getitem__, s.ranks), strict=True), s.caused, strict=True):
                    by_step[key] = get(key, 0.0) + cause
            self._found += s.found
            order[self._summed - 1].settled = _Settled(array("i"), array("i"), array("d"), [], s.analysed, s.partial)

    def _record(self, name: str, i: int, caused: float) -> Record:
        """The :class:`Record` of call `i` of group `name`, from its columns (before they are freed)."""
        c = self._calls[name]
        prev_group = c.prev_group[i]
        return Record(c.step[i], c.rank[i], caused, name, c.base + i, c.most[i] - c.least[i], self._call(name, i, caused),
                      None if prev_group < 0 else self.group_ids.values[prev_group], c.prev_seq[i], c.prev_lat[i], c.most_rank[i],
                      c.prev_site[i] < 0, c.ordinal[i], c.ordinal[i] > self.first_meeting.get(c.rank[i], 0))
    def _call(self, name: str, i: int, caused: float) -> LateCall:
        c = self._calls[name]
        sites = self.sites.values
        op, module, source = sites[c.site[i]]
        prev = c.prev_site[i]
        seq = c.base + i
        count = len(c.ranks) if not c.size else c.size
        after = None
        if prev >= 0:
            p_op, p_module, p_source = sites[prev]
            p_group = c.prev_group[i]
            known = self._calls.get(self.group_ids.values[p_group]) if p_group >= 0 else None
            label = known.label if known is not None else None
            after = CallSite(p_op, None if c.prev_seq[i] < 0 else c.prev_seq[i], p_source, _module(p_module), label)
        gap = others = start = None
        if c.gaps_known:
            gap = c.gap[i]
            start = c.start[i] if c.start else None
            others = (c.gaps[i] - gap) / (count - 1)
        return LateCall(c.label, seq, op, caused, c.most[i] - c.least[i], count - 1, _module(module), source, gap, others,
                        after, CallSite(op, seq, source, _module(module), c.label), start)


def _add_batch(sums: array, lo: int, columns: list[array]) -> None:
    """Per index k, the columns' values added left to right, then added to ``sums[lo + k]``:
    in C where it is built, else the same additions in Python."""
    if _late is not None:
        _late.add_batch(sums, lo, columns)
        return
    across: Iterable[float] = columns[0]
    for column in columns[1:]:
        across = map(_add, across, column)
    hi = lo + len(columns[0])
    sums[lo:hi] = array("d", map(_add, sums[lo:hi], across))


def _module(module: str | None) -> str | None:
    return None if module in (None, "", "?") else module


def _counts(runs: list[int], base: int, n: int) -> list[int]:
    """How many ranks' spans (first, last pairs in `runs`) cover each of n sequence numbers from `base`."""
    diff = [0] * (n + 1)
    for i in range(0, len(runs), 2):
        diff[runs[i] - base] += 1
        diff[runs[i + 1] - base + 1] -= 1
    return list(accumulate(diff[:n]))
