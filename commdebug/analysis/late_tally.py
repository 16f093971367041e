"""The merge of the ranks' late-rank digests (:mod:`commdebug.analysis.late`): one pass over
them, memory that does not grow with the number of ranks, then the listed (step, rank) pairs."""

from __future__ import annotations

from array import array
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

from commdebug.analysis.late import CALLS_KEPT, CallSite, GapOps, LateCall, LateRank, LateRanks, LateThreshold
from commdebug.analysis.late_digest import GroupPart, LateDigest, step_medians

__all__ = ["LateTally", "BATCH", "PENDING"]

BATCH = 8  # a group's members merged together (column by column across them, in C)
PENDING = 256  # (rank, group) shares waiting in unfinished batches, at most: memory stays bounded

_INF = float("inf")


class _Calls:
    """One group's calls, by sequence number from ``base``: the analysis's flat arrays."""

    __slots__ = ("base", "label", "size", "ranks", "runs", "least", "total", "most", "gaps", "gaps_known", "step", "skip",
                 "rank", "gap", "start", "site", "prev_seq")

    def __init__(self, base: int, label: str, size: int) -> None:
        self.base, self.label, self.size = base, label, size
        self.ranks: set[int] = set()  # the members seen (the group's size when it is unknown)
        self.runs: list[int] = []  # first, last, first, last...: every rank's spans of sequence numbers
        self.least, self.total, self.most, self.gaps = array("d"), array("d"), array("d"), array("d")
        self.gaps_known = True
        self.step, self.skip = array("q"), array("b")
        # the member with the least latency so far: its rank, gap, start, call site and its
        # previous call's (site | (previous site + 1) << 32), the previous call's number
        self.rank, self.gap, self.start = array("i"), array("d"), array("d")
        self.site, self.prev_seq = array("q"), array("q")

    def cover(self, first: int, last: int) -> list[int]:
        """Make room for sequence numbers first..last: the range of the new ones (from, to),
        which take their steps from the rank that brought them."""
        new: list[int] = []
        if not self.least:
            self.base = first
        elif first < self.base:
            grow = self.base - first
            self.least = array("d", [_INF]) * grow + self.least
            for name in ("total", "most", "gaps", "gap", "start"):
                setattr(self, name, array("d", [0.0]) * grow + getattr(self, name))
            self.step = array("q", [-1]) * grow + self.step
            self.skip = array("b", [0]) * grow + self.skip
            self.rank = array("i", [-1]) * grow + self.rank
            self.site = array("q", [0]) * grow + self.site
            self.prev_seq = array("q", [-1]) * grow + self.prev_seq
            self.base = first
            new += (0, grow)
        end = last - self.base + 1
        have = len(self.least)
        if end > have:
            grow = end - have
            self.least.extend(array("d", [_INF]) * grow)
            for a in (self.total, self.most, self.gaps, self.gap, self.start):
                a.extend(array("d", [0.0]) * grow)
            self.step.extend(array("q", [-1]) * grow)
            self.skip.extend(array("b", [0]) * grow)
            self.rank.extend(array("i", [-1]) * grow)
            self.site.extend(array("q", [0]) * grow)
            self.prev_seq.extend(array("q", [-1]) * grow)
            new += (have, end)
        return new


class LateTally:
    """The late-rank analysis in one pass over the ranks' digests (see the module docstring)."""

    def __init__(self) -> None:
        self.groups: dict[str, _Calls] = {}
        self.sites: list[tuple[str, str | None, str | None]] = []  # (op, module, source) by id
        self._site_ids: dict[tuple[str, str | None, str | None], int] = {}
        self._shifted: list[int] = []  # per site id: (id + 1) << 32, a previous call's part of a packed site
        self.step_times: dict[int, tuple[array, array]] = {}
        self.timed = False
        self.gaps_known = True
        self._pending: dict[str, list[tuple[LateDigest, GroupPart]]] = {}  # group -> members not merged yet
        self._waiting = 0

    def add(self, d: LateDigest) -> None:
        """One rank's digest. Its share of each group waits for up to :data:`BATCH` members of
        the group, merged together (a member's calls are compared with the others' a column at
        a time, and only the final late member's names are read)."""
        if d.timed:
            self.timed = True
            self.step_times[d.rank] = (d.step_list, d.step_times)
        if d.groups and d.starts is None:
            self.gaps_known = False
        for part in d.groups:
            batch = self._pending.setdefault(part.name, [])
            batch.append((d, part))
            self._waiting += 1
            if len(batch) >= min(part.size or BATCH, BATCH):
                self._flush(part.name)
        if self._waiting > PENDING:
            self.flush()

    def flush(self) -> None:
        """Merge every member waiting in a batch."""
        for name in list(self._pending):
            self._flush(name)

    def _flush(self, name: str) -> None:
        batch = self._pending.pop(name)
        self._waiting -= len(batch)
        d0, p0 = batch[0]
        n, first = len(p0.seqs), p0.seqs[0]
        same = len(batch) > 1 and all(len(p.seqs) == n and p.seqs[0] == first and p.seqs[-1] == first + n - 1
                                      and (p.gaps is None) == (p0.gaps is None) for _, p in batch) \
            and not any(map(_ge, p0.seqs, p0.seqs[1:]))
        if not same or any(any(map(_ge, p.seqs, p.seqs[1:])) for _, p in batch[1:]):
            for d, part in batch:
                self._add_group(d, part)
            return
        self._add_batch(batch)

    def _add_batch(self, batch: list[tuple[LateDigest, GroupPart]]) -> None:
        """Members of one group with the same calls (the same run of sequence numbers): merged
        as one, a column across them at a time."""
        d0, p0 = batch[0]
        n, first = len(p0.seqs), p0.seqs[0]
        last = first + n - 1
        c = self._group(p0)
        for d, part in batch:
            c.ranks.add(d.rank)
            if part.size > c.size:
                c.size = part.size
        lats = [p.lats for _, p in batch]
        least = list(map(min, *lats))
        who = list(map(tuple.index, zip(*lats, strict=True), least))  # the first member with the least
        gaps = None if p0.gaps is None else [p.gaps for _, p in batch]
        if gaps is None:
            c.gaps_known = False
        new = c.cover(first, last)
        base = c.base
        lo, hi = first - base, first - base + n
        if new:
            self._steps(c, new, first, last, d0.steps, p0.pos)
        c.runs += (first, last) * len(batch)
        better = list(map(_lt, least, c.least[lo:hi]))
        c.total[lo:hi] = array("d", map(_add, c.total[lo:hi], map(sum, zip(*lats, strict=True))))
        most = list(map(max, *lats))
        worse = list(map(_gt, most, c.most[lo:hi]))
        if False not in worse:
            c.most[lo:hi] = array("d", most)
        elif True in worse:
            at = c.most
            for j in compress(range(n), worse):
                at[lo + j] = most[j]
        if gaps is not None:
            c.gaps[lo:hi] = array("d", map(_add, c.gaps[lo:hi], map(sum, zip(*gaps, strict=True))))
        for _, part in batch:
            for seq in part.uneven:
                c.skip[seq - base] = 1
        if True not in better:
            return
        js_of: list[list[int]] = [[] for _ in batch]
        for j in compress(range(n), better) if False in better else range(n):
            js_of[who[j]].append(j)
        for m, js in enumerate(js_of):
            if js:
                d, part = batch[m]
                self._won(c, d.rank, [lo + j for j in js], js, part.lats, part.gaps, d, part.pos)

    def _group(self, part: GroupPart) -> _Calls:
        c = self.groups.get(part.name)
        if c is None:
            c = self.groups[part.name] = _Calls(part.seqs[0], part.label, part.size)
        return c

    @staticmethod
    def _steps(c: _Calls, new: list[int], first: int, last: int, steps: array, pos: array) -> None:
        """The steps of the calls `new` (ranges of indices) takes from the member that brought
        them, whose calls first..last are at places `pos` of its own."""
        base, step = c.base, c.step
        for a, b in zip(new[::2], new[1::2], strict=True):
            a, b = max(a, first - base), min(b, last - base + 1)
            if a < b:
                step[a:b] = array("q", map(steps.__getitem__, pos[a + base - first:b + base - first]))

    def _names(self, d: LateDigest, ps: list[int]) -> tuple[list[int], list[int], list[float]]:
        """What names the calls at places `ps` of rank `d` (where it arrived last so far): per
        call its site and its previous call's (``site | (previous site + 1) << 32``), the
        previous call's sequence number (-1: none) and its start (0.0: unknown). In C, a column
        at a time: a rank arrives last at a few thousand calls."""
        ops, modules, sources, ids = d.ops, d.modules, d.sources, self._site_ids
        head = bool(ps) and ps[0] == 0  # its first call: nothing before it
        prev = list(map(_sub, ps[1:] if head else ps, repeat(1)))
        keys = list(zip(map(ops.__getitem__, ps), map(modules.__getitem__, ps), map(sources.__getitem__, ps), strict=True))
        before = list(zip(map(ops.__getitem__, prev), map(modules.__getitem__, prev), map(sources.__getitem__, prev), strict=True))
        try:
            here, there = list(map(ids.__getitem__, keys)), list(map(ids.__getitem__, before))
        except KeyError:  # sites not seen before: named once, for every rank
            for key in dict.fromkeys(keys + before):
                if key not in ids:
                    ids[key] = len(self.sites)
                    self.sites.append(key)
                    self._shifted.append(len(self.sites) << 32)
            here, there = list(map(ids.__getitem__, keys)), list(map(ids.__getitem__, before))
        after = list(map(self._shifted.__getitem__, there))  # (previous site + 1) << 32
        seqs = list(map(d.seqs.__getitem__, prev))  # -1: a send or receive before it
        if head:
            after.insert(0, 0)
            seqs.insert(0, -1)
        packed = list(map(_or, here, after))
        prev_seqs = seqs
        starts = list(map(d.starts.__getitem__, ps)) if d.starts is not None else [0.0] * len(ps)
        return packed, prev_seqs, starts

    def _add_group(self, d: LateDigest, part: GroupPart) -> None:
        rank = d.rank
        seqs, lats, gaps, pos = part.seqs, part.lats, part.gaps, part.pos
        n = len(seqs)
        first, last = min(seqs), max(seqs)
        c = self.groups.get(part.name)
        if c is None:
            c = self.groups[part.name] = _Calls(first, part.label, part.size)
        elif part.size > c.size:
            c.size = part.size
        c.ranks.add(rank)
        if gaps is None:
            c.gaps_known = False
        new = c.cover(first, last)
        base = c.base
        contiguous = last - first == n - 1 and seqs[0] == first and not any(map(_ge, seqs, seqs[1:]))
        if new:  # the calls first seen here take this rank's steps
            step, steps = c.step, d.steps
            if contiguous:
                self._steps(c, new, first, last, steps, pos)
            else:
                for seq, p in zip(seqs, pos, strict=True):
                    k = seq - base
                    if step[k] < 0:
                        step[k] = steps[p]
        if contiguous:  # the usual case: a slice at a time, in C
            c.runs += (first, last)
            lo, hi = first - base, first - base + n
            better = list(map(_lt, lats, c.least[lo:hi]))
            c.total[lo:hi] = array("d", map(_add, c.total[lo:hi], lats))
            worse = list(map(_gt, lats, c.most[lo:hi]))
            if gaps is not None:
                c.gaps[lo:hi] = array("d", map(_add, c.gaps[lo:hi], gaps))
            if False not in worse:
                c.most[lo:hi] = lats
            elif True in worse:
                most = c.most
                for j in compress(range(n), worse):
                    most[lo + j] = lats[j]
            if False not in better:  # the first member here (or the last to come everywhere)
                packed, prev_seqs, starts = self._names(d, pos.tolist())
                c.least[lo:hi] = lats
                c.rank[lo:hi] = array("i", [rank]) * n
                c.site[lo:hi] = array("q", packed)
                c.prev_seq[lo:hi] = array("q", prev_seqs)
                if gaps is not None:
                    c.gap[lo:hi] = gaps
                    c.start[lo:hi] = array("d", starts)
            elif True in better:
                js = list(compress(range(n), better))
                self._won(c, rank, [lo + j for j in js], js, lats, gaps, d, pos)
        else:  # out of order or with holes: a call at a time
            runs: list[int] = []
            ks, js = [], []
            for j, seq in enumerate(seqs):
                if runs and runs[-1] + 1 == seq:
                    runs[-1] = seq
                elif not runs or runs[-1] != seq:  # a repeated number counts once
                    runs += (seq, seq)
                k = seq - base
                lat = lats[j]
                c.total[k] += lat
                if lat > c.most[k]:
                    c.most[k] = lat
                if gaps is not None:
                    c.gaps[k] += gaps[j]
                if lat < c.least[k]:
                    c.least[k] = lat
                    ks.append(k)
                    js.append(j)
            c.runs += runs
            if ks:
                self._won(c, rank, ks, js, lats, gaps, d, pos)
        for seq in part.uneven:
            c.skip[seq - base] = 1

    def _won(self, c: _Calls, rank: int, ks: list[int], js: list[int], lats: array, gaps: array | None, d: LateDigest,
             pos: array) -> None:
        """Rank `rank` has the least latency so far at indices `ks` (its calls `js` of the
        group): it is the late one there, until a later rank comes later still."""
        packed, prev_seqs, starts = self._names(d, list(map(pos.__getitem__, js)))
        least, ranks, gap, site, prev, start = c.least, c.rank, c.gap, c.site, c.prev_seq, c.start
        for k, j, s, q, t in zip(ks, js, packed, prev_seqs, starts, strict=True):
            least[k] = lats[j]
            ranks[k] = rank
            site[k] = s
            prev[k] = q
            if gaps is not None:
                gap[k] = gaps[j]
                start[k] = t

    def step_medians(self) -> dict[int, float]:
        """Per step, the median over ranks of each rank's time in collectives there."""
        return step_medians(list(self.step_times.values()))

    def result(self, threshold: LateThreshold | None = None, gap_ops: GapOps | None = None,
               medians: dict[int, float] | None = None) -> LateRanks:
        """The :class:`LateRanks` of every rank added. `medians`: the steps' median
        communication times, when the caller has them (:meth:`step_medians`)."""
        self.flush()
        threshold = threshold or LateThreshold()
        medians = self.step_medians() if medians is None else medians
        out = LateRanks([], threshold, 0, timed=self.timed, gaps_known=self.gaps_known)
        by_step = out.by_step
        floor = threshold.seconds
        found: dict[tuple[int, int], list[tuple[float, str, int]]] = {}
        for name, c in self.groups.items():
            size = c.size or len(c.ranks)
            count = _counts(c.runs, c.base, len(c.least))
            complete = list(map(_eq, count, repeat(size)))
            if True in c.skip:
                complete = list(map(_and, complete, map(_eq, c.skip, repeat(0))))
            out.partial += len(count) - count.count(0) - count.count(size)
            if size < 2:
                continue
            out.analysed += complete.count(True)
            caused = list(map(_sub, c.total, map(_mul, count, c.least)))
            # the calls that made anyone wait (float noise aside: every member came at once)
            waited = list(map(_and, complete, map(_gt, caused, repeat(1e-12))))
            at = list(compress(range(len(count)), waited))
            keys = list(zip(map(c.step.__getitem__, at), map(c.rank.__getitem__, at), strict=True))
            get = by_step.get
            for key, cause in zip(keys, map(caused.__getitem__, at), strict=True):
                by_step[key] = get(key, 0.0) + cause
            # the ones worth naming: the caused wait is at least the longest single one
            longest = list(map(_sub, c.most, c.least))
            for j in compress(range(len(at)), map(_ge, map(longest.__getitem__, at), repeat(floor))):
                i = at[j]
                found.setdefault(keys[j], []).append((caused[i], name, i))
        by_rank = out.caused_by_rank
        for (_, r), cause in by_step.items():
            by_rank[r] = by_rank.get(r, 0.0) + cause
        for (step, r), calls in found.items():
            limit = threshold.limit(medians.get(step))
            kept = sorted((x for x in calls if self._longest(x[1], x[2]) >= limit), key=lambda x: (-x[0], x[1], x[2]))
            if not kept:
                continue
            late = [self._call(name, i, cause) for cause, name, i in kept[:CALLS_KEPT]]
            entry = LateRank(step, r, late[0], by_step[(step, r)], late)
            w = late[0]
            if gap_ops is not None and w.gap_s is not None and w.start_s is not None:
                entry.gap_top = gap_ops(r, w.start_s - w.gap_s, w.start_s)
            out.entries.append(entry)
        out.entries.sort(key=lambda e: (-e.worst.caused_s, e.step, e.rank))
        return out

    def _longest(self, name: str, i: int) -> float:
        c = self.groups[name]
        return c.most[i] - c.least[i]

    def _call(self, name: str, i: int, caused: float) -> LateCall:
        c = self.groups[name]
        sites = self.sites
        packed = c.site[i]
        op, module, source = sites[packed & 0xFFFFFFFF]
        prev = (packed >> 32) - 1
        seq = c.base + i
        count = len(c.ranks) if not c.size else c.size
        after = None
        if prev >= 0:
            p_op, p_module, p_source = sites[prev]
            after = CallSite(p_op, None if c.prev_seq[i] < 0 else c.prev_seq[i], p_source, _module(p_module))
        gap = others = start = None
        if c.gaps_known:
            gap, start = c.gap[i], c.start[i]
            others = (c.gaps[i] - gap) / (count - 1)
        return LateCall(c.label, seq, op, caused, c.most[i] - c.least[i], count - 1, _module(module), source, gap, others,
                        after, CallSite(op, seq, source, _module(module)), start)


def _module(module: str | None) -> str | None:
    return None if module in (None, "", "?") else module


def _counts(runs: list[int], base: int, n: int) -> list[int]:
    """How many ranks' spans (first, last pairs in `runs`) cover each of n sequence numbers from `base`."""
    diff = [0] * (n + 1)
    for i in range(0, len(runs), 2):
        diff[runs[i] - base] += 1
        diff[runs[i + 1] - base + 1] -= 1
    return list(accumulate(diff[:n]))
