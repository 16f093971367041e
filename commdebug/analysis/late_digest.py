"""One rank's share of the late-rank analysis (:mod:`commdebug.analysis.late`): its timed calls'
numbers, latencies, gaps and steps per group, and what names each of its calls, made in the
worker process that read the rank (``report``'s and ``check``'s digests hold one).

The digest is made in one pass over the events in C (:mod:`commdebug.analysis._late`, an
optional extension: setup.py) where it is built, else a column at a time in Python; both give
the same digest (tests/test_late_native.py compares them). It holds flat arrays only, so it
crosses from the worker to the merging process as a few memory copies, not ten thousand
objects per column."""

from __future__ import annotations

import statistics
import sys
from array import array
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import (
    add as _add,
    and_ as _and,
    gt as _gt,
    itemgetter,
    sub as _sub,
)
from typing import Any, NamedTuple

from commdebug.analysis.divergence import Interner
from commdebug.model.columns import GROUP_NAME, IS_NOT_NONE, LATENCY, OP, SEQ, SPLITS, START, STEP
from commdebug.model.trace import CollectiveEvent
from commdebug.ops import needs_all

try:  # the passes in C: optional (setup.py), the same digest without it
    import commdebug.analysis._late as _late
except ImportError:  # pragma: no cover - no C compiler at install
    _late = None  # type: ignore[assignment]

__all__ = ["LATE_IN_C", "GroupPart", "Known", "Site", "LateDigest", "late_digest", "step_times", "step_medians"]

Site = tuple[str, "str | None", "str | None"]  # (op, module, source line): what names a call
_SITE = itemgetter(*(CollectiveEvent._fields.index(f) for f in ("op", "module", "source")))  # an event's Site, in C
# what _late.columns reads of each event, by index
_FIELDS = tuple(CollectiveEvent._fields.index(f) for f in ("latency_s", "seq", "start_s", "step", "group", "op", "module", "source"))
# sum() of floats adds left to right before Python 3.12 (it compensates from 3.12 on): only then
# are the C digest's step times, summed left to right, those of step_times()
_PLAIN_SUM = sys.version_info < (3, 12)
LATE_IN_C = _late is not None  # the digest is made from the events in C: the columns a caller has are not read


class GroupPart(NamedTuple):
    """One rank's timed calls on one group, in call order: parallel columns. What names each
    call is here too (its site, the call before it, its start), so that the merge copies it
    from the same place in one step where the rank arrived last."""

    name: str
    label: str
    size: int  # members (0: unknown)
    seqs: array  # q
    lats: array  # d
    gaps: array | None  # d; None: no start times
    steps: array  # q
    sites: array  # i: ids into the digest's ``table``
    prev_sites: array  # i: the site of the rank's call before (on any group); -1: none
    prev_seqs: array  # q: that call's sequence number; -1: none, or a send or receive
    prev_groups: array  # i: that call's group, as an index into the digest's ``groups``; -1: none, untimed or unnumbered
    prev_lats: array  # d: the rank's latency in that call; -1: none, or untimed
    ordinals: array  # q: each call's place among the rank's events (0: its first)
    starts: array | None  # d: when the rank made each call; None: not asked for, or not recorded
    run: bool  # its sequence numbers are one run, first to last (the usual case): merged a slice at a time
    uneven: tuple[int, ...]  # sequence numbers of all_to_all calls left out (uneven or unknown splits)
    members: tuple[int, ...] | None = None  # the group's global ranks, where the dump names them


class Known(NamedTuple):
    """What a caller already holds of one group's timed calls with a sequence number, in call
    order: their sequence numbers, and where it has them, their latencies, steps and sites (ids
    into the caller's site table). Only the pure-Python digest reads them (the C one reads the
    events)."""

    seqs: array
    lats: array | None = None
    steps: array | None = None
    sites: array | None = None


@dataclass
class LateDigest:
    """One rank's share of the late-rank analysis, picklable, flat arrays only (see the module
    docstring): per group its timed calls' columns; the call sites they point to."""

    rank: int
    groups: list[GroupPart]
    table: list[Site]  # the call sites (op, module, source) that the groups' site ids point to
    step_list: array  # the steps it timed calls in, ascending, and its time in collectives at each
    step_times: array
    timed: bool  # some call timed
    whole: bool = True  # its first event is its process's first collective, as far as known: its first call's wait is start-up
    first_meeting: int = 0  # the place of its first call that made it meet the others (ops.needs_all) among its events


def step_times(t_steps: list[int], t_lats: list[float]) -> tuple[array, array]:
    """A rank's time in collectives per step, from its timed calls' steps and latencies: (the
    steps ascending, the time at each), summed a slice at a time when the steps come in call
    order (always, for a recording)."""
    step_list: list[int] = []
    step_sums: list[float] = []
    if sorted(t_steps) == t_steps:  # in call order: each step a slice (sorting a sorted list is one pass)
        i, n = 0, len(t_steps)
        while i < n:
            step = t_steps[i]
            j = bisect_right(t_steps, step, i)
            step_list.append(step)
            step_sums.append(sum(t_lats[i:j]))
            i = j
    else:
        per_step: dict[int, float] = {}
        for step, latency in zip(t_steps, t_lats, strict=True):
            per_step[step] = per_step.get(step, 0.0) + latency
        step_list = sorted(per_step)
        step_sums = [per_step[k] for k in step_list]
    return array("q", step_list), array("d", step_sums)


def step_medians(per_rank: Sequence[tuple[array, array]]) -> dict[int, float]:
    """Per step, the median over ranks of each rank's time at that step (from each rank's
    :func:`step_times`); a step of one rank only has none."""
    by_step: dict[int, array] = {}
    for steps, times in per_rank:
        for step, t in zip(steps, times, strict=True):
            at = by_step.get(step)
            if at is None:
                at = by_step[step] = array("d")
            at.append(t)
    return {step: float(statistics.median(ts)) for step, ts in by_step.items() if len(ts) > 1}


def late_digest(rank: int, events: list[CollectiveEvent], *, times: tuple[array, array] | None = None,
                lats: list[float | None] | None = None, seqs: list[int | None] | None = None, ops: list[str] | None = None,
                names: list[str] | None = None, steps: list[int] | None = None, timed: list[bool] | None = None,
                masks: dict[str, list[bool]] | None = None, known: dict[str, Known] | None = None,
                table: list[Site] | None = None, kinds: Collection[str] | None = None, starts: bool = True) -> LateDigest:
    """The :class:`LateDigest` of one rank's events (in call order): in one pass in C
    (:mod:`commdebug.analysis._late`) where it is built, else a column at a time in Python;
    the same digest either way.

    `times`: its :func:`step_times`; `kinds`: the ops the events are of; `starts`: whether to
    keep each call's start (only a profile's :data:`~commdebug.analysis.late.GapOps` reads them).
    For the Python digest, the columns where the caller has them already: ``lats``, ``seqs``,
    ``ops``, ``names``, ``steps`` (each event's), ``timed`` (whether each is), ``masks`` (per
    group, which calls are its timed ones with a sequence number), ``known`` (per group, what
    the caller holds of those calls: :class:`Known`), ``table`` (the sites that ``known``'s
    site ids point to; with it, every event must be one of ``known``'s calls)."""
    if _late is not None:
        try:
            found = _late.columns(events if type(events) is list else list(events), _FIELDS, starts, times is None and _PLAIN_SUM)
        except TypeError:  # a field of an unexpected type: the Python digest says what becomes of it
            found = None
        if found is not None:
            digest = _from_columns(rank, events, found, times, ops, kinds)
        else:
            digest = _python_digest(rank, events, times, lats, seqs, ops, names, steps, timed, masks, known, table, kinds, starts)
    else:
        digest = _python_digest(rank, events, times, lats, seqs, ops, names, steps, timed, masks, known, table, kinds, starts)
    # the recording began with the process where its first event is its first and the first call
    # on its group (a Flight Recorder ring that wrapped, or a profile of later steps, does not)
    digest.whole = not events or (events[0].index == 0 and events[0].seq in (None, 0))
    # before it the rank met nobody (broadcasts): a wait for it there is still its start's
    digest.first_meeting = next(compress(count(), map(needs_all, map(OP, events))), len(events))
    return digest


def _from_columns(rank: int, events: list[CollectiveEvent], found: tuple[list[tuple[Any, ...]], list[Site], tuple[array, array] | None, int],
                  times: tuple[array, array] | None, ops: list[str] | None, kinds: Collection[str] | None) -> LateDigest:
    """The digest of :func:`commdebug.analysis._late.columns`'s columns."""
    parts, table, own_times, timed = found
    if times is None:
        times = own_times if own_times is not None else _step_times_of(events)
    if kinds is None:
        kinds = set(map(OP, events)) if ops is None else ops
    uneven_ops = "all_to_all" in kinds
    groups = []
    for info, g_seqs, g_lats, gaps, g_steps, sites, prev_sites, prev_seqs, prev_groups, prev_lats, ordinals, g_starts, run in parts:
        groups.append(GroupPart(info.name, info.label, info.size, g_seqs, g_lats, gaps, g_steps, sites, prev_sites, prev_seqs,
                                prev_groups, prev_lats, ordinals, g_starts, run, _uneven(events, info.name) if uneven_ops else (),
                                info.ranks))
    return LateDigest(rank, groups, table, times[0], times[1], timed > 0)


def _step_times_of(events: list[CollectiveEvent]) -> tuple[array, array]:
    """:func:`step_times` of a rank's timed calls."""
    lats = list(map(LATENCY, events))
    timed = list(map(IS_NOT_NONE, lats))
    return step_times(list(map(STEP, compress(events, timed))), list(compress(lats, timed)))


def _uneven(events: list[CollectiveEvent], name: str) -> tuple[int, ...]:
    """The sequence numbers of a rank's timed all_to_all calls on group `name` whose splits are
    uneven or unknown, in call order."""
    return tuple(e.seq for e in events if e.op == "all_to_all" and e.seq is not None and e.latency_s is not None
                 and e.group.name == name and not _even(e))


def _python_digest(rank: int, events: list[CollectiveEvent], times: tuple[array, array] | None, lats: list[float | None] | None,
                   seqs: list[int | None] | None, ops: list[str] | None, names: list[str] | None, steps: list[int] | None,
                   timed: list[bool] | None, masks: dict[str, list[bool]] | None, known: dict[str, Known] | None,
                   table: list[Site] | None, kinds: Collection[str] | None, keep_starts: bool) -> LateDigest:
    """:func:`late_digest` a column at a time, in Python (where the C module is not built)."""
    lats = list(map(LATENCY, events)) if lats is None else lats
    seqs = list(map(SEQ, events)) if seqs is None else seqs
    all_timed = None not in lats if timed is None else False not in timed
    if timed is None and (masks is None or not all_timed):
        timed = list(map(IS_NOT_NONE, lats))
    if masks is None:
        pairable = list(map(_and, timed, map(IS_NOT_NONE, seqs)))  # type: ignore[arg-type]
        names = list(map(GROUP_NAME, events)) if names is None else names
        masks = {name: list(map(_and, map(name.__eq__, names), pairable)) for name in dict.fromkeys(compress(names, pairable))}
    if times is None:
        if all_timed:
            steps = list(map(STEP, events)) if steps is None else steps
            times = step_times(steps, lats)  # type: ignore[arg-type]
        else:
            times = step_times(list(map(STEP, compress(events, timed))), list(compress(lats, timed)))  # type: ignore[arg-type]
    if not masks:
        return LateDigest(rank, [], [], times[0], times[1], bool(lats) if timed is None else True in timed)
    known = known or {}
    starts: list[float] | None = list(map(START, events))
    try:
        # a call's gap: from the end of the call before it (an untimed one ends when it starts);
        # the first has no call of its own before it: 0, never the time since the recording began
        gaps: list[float] | None = [0.0, *map(_sub, starts[1:], map(_add, starts, lats if all_timed else [x or 0.0 for x in lats]))]  # type: ignore[index, arg-type]
    except TypeError:  # Flight Recorder: no start times, so no gaps
        starts = gaps = None
    if gaps is not None and min(gaps) < 0:  # overlapping calls (asynchronous timing): no gap
        _no_overlap(gaps)
    if steps is None and any(name not in known or known[name].steps is None for name in masks):
        steps = list(map(STEP, events))
    ops = list(map(OP, events)) if ops is None else ops
    uneven_ops = "all_to_all" in (ops if kinds is None else kinds)
    sites: list[int] | None = [0] * len(events) if table is not None else None
    where = range(len(events))
    found = []
    for name, mine in masks.items():
        pos = list(compress(where, mine))
        have = known.get(name) or Known(array("q", compress(seqs, mine)))
        if sites is not None:
            assert have.sites is not None  # a table comes with every group's sites
            any(map(sites.__setitem__, pos, have.sites))  # each call's site, in its place
        found.append((name, mine, pos, have))
    if sites is None or table is None:
        interned = Interner()
        sites, table = interned.many(map(_SITE, events)), interned.values
    numbers = seqs if None not in seqs else [-1 if q is None else q for q in seqs]
    before_sites, before_seqs = [-1, *sites[:-1]], [-1, *numbers[:-1]]  # the call before each
    owner = [-1] * len(events)  # each call's group, as an index into ``groups``; -1: not timed or no number
    for k, (_, _, pos, _) in enumerate(found):
        any(map(owner.__setitem__, pos, repeat(k)))
    before_groups = [-1, *owner[:-1]]
    before_lats = [-1.0, *(-1.0 if x is None else x for x in lats[:-1])]
    groups = []
    for name, mine, pos, have in found:
        info = events[pos[0]].group
        g_seqs = have.seqs
        g_lats = have.lats if have.lats is not None else array("d", list(compress(lats, mine)))  # type: ignore[type-var]
        g_steps = have.steps if have.steps is not None else array("q", compress(steps, mine))  # type: ignore[arg-type]
        uneven = _uneven(events, name) if uneven_ops else ()
        run = g_seqs == array("q", range(g_seqs[0], g_seqs[0] + len(g_seqs)))
        groups.append(GroupPart(name, info.label, info.size, g_seqs, g_lats, None if gaps is None else array("d", list(compress(gaps, mine))),
                                g_steps, array("i", map(sites.__getitem__, pos)), array("i", compress(before_sites, mine)),
                                array("q", compress(before_seqs, mine)), array("i", compress(before_groups, mine)),
                                array("d", compress(before_lats, mine)), array("q", pos),
                                array("d", compress(starts, mine)) if keep_starts and starts is not None else None, run, uneven, info.ranks))
    return LateDigest(rank, groups, table, times[0], times[1], True)


def _no_overlap(gaps: list[float]) -> None:
    """Every gap that is not positive made 0 (calls that overlap, under asynchronous timing),
    in place; only a few are, so they are found in C and set one by one."""
    flags = list(map(_gt, gaps, repeat(0.0)))
    at = -1
    for _ in range(flags.count(False)):
        at = flags.index(False, at + 1)
        gaps[at] = 0.0


def _even(e: CollectiveEvent) -> bool:
    """Whether an all_to_all moved the same bytes to and from every member (splits recorded)."""
    send, recv = SPLITS(e)
    return send is not None and recv is not None and len(set(send)) <= 1 and len(set(recv)) <= 1
