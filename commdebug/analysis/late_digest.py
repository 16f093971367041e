"""One rank's share of the late-rank analysis (:mod:`commdebug.analysis.late`): its timed calls'
numbers, latencies, gaps and steps per group, and what names each of its calls, made in the
worker process that read the rank (``report``'s and ``check``'s digests hold one)."""

from __future__ import annotations

import statistics
from array import array
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import (
    add as _add,
    and_ as _and,
    gt as _gt,
    itemgetter,
    sub as _sub,
)
from typing import NamedTuple

from commdebug.analysis.divergence import Interner
from commdebug.model.columns import GROUP_NAME, IS_NOT_NONE, LATENCY, OP, SEQ, SPLITS, START, STEP
from commdebug.model.trace import CollectiveEvent

__all__ = ["GroupPart", "Known", "Places", "Site", "LateDigest", "late_digest", "step_times", "step_medians"]

Site = tuple[str, "str | None", "str | None"]  # (op, module, source line): what names a call
_SITE = itemgetter(*(CollectiveEvent._fields.index(f) for f in ("op", "module", "source")))  # an event's Site, in C


class GroupPart(NamedTuple):
    """One rank's timed calls on one group, in call order: parallel columns."""

    name: str
    label: str
    size: int  # members (0: unknown)
    seqs: array  # q
    lats: array  # d
    gaps: array | None  # d; None: no start times
    steps: array | None  # q; None: read from the digest's :class:`Places`
    pos: list[int]  # each call's place among the rank's calls (the digest's :class:`Places`)
    run: bool  # its sequence numbers are one run, first to last (the usual case): merged a slice at a time
    uneven: tuple[int, ...]  # sequence numbers of all_to_all calls left out (uneven or unknown splits)


class Known(NamedTuple):
    """What a caller already holds of one group's timed calls with a sequence number, in call
    order: their sequence numbers, and where it has them, their latencies, steps and sites (ids
    into the caller's site table)."""

    seqs: array
    lats: array | None = None
    steps: array | None = None
    sites: array | None = None


class Places(NamedTuple):
    """What names a rank's calls, by place in call order: each call's site (an id into
    ``table``), its sequence number, its start and its step; a late call's entry reads its own
    and the call's before it. The merge reads them only where the rank arrived last (and the
    steps of calls no rank brought before), while it merges the rank; nothing keeps them
    after."""

    sites: list[int]
    table: list[Site]
    seqs: list[int]  # -1: a send or receive (no sequence number)
    starts: list[float] | None  # None: not recorded
    steps: list[int] | None  # None: each group's are in its part


@dataclass
class LateDigest:
    """One rank's share of the late-rank analysis, picklable (see the module docstring): per
    group its timed calls' numbers, latencies, gaps and steps, and their places among its calls;
    per place, what names the call (:class:`Places`)."""

    rank: int
    groups: list[GroupPart]
    places: Places | None  # None: no call timed with a sequence number
    step_list: array  # the steps it timed calls in, ascending, and its time in collectives at each
    step_times: array
    timed: bool  # some call timed


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
                table: list[Site] | None = None, kinds: Collection[str] | None = None) -> LateDigest:
    """The :class:`LateDigest` of one rank's events (in call order), a column at a time.

    `times`: its :func:`step_times`; the columns, where the caller has them already: ``lats``,
    ``seqs``, ``ops``, ``names``, ``steps`` (each event's), ``timed`` (whether each is), ``masks``
    (per group, which calls are its timed ones with a sequence number), ``known`` (per group,
    what the caller holds of those calls: :class:`Known`), ``table`` (the sites that
    ``known``'s site ids point to; with it, every event must be one of ``known``'s calls) and
    ``kinds`` (the ops the events are of)."""
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
        return LateDigest(rank, [], None, times[0], times[1], bool(lats) if timed is None else True in timed)
    known = known or {}
    starts: list[float] | None = list(map(START, events))
    try:
        # a call's gap: from the end of the call before it (an untimed one ends when it starts)
        gaps: list[float] | None = [starts[0], *map(_sub, starts[1:], map(_add, starts, lats if all_timed else [x or 0.0 for x in lats]))]  # type: ignore[index, arg-type]
    except TypeError:  # Flight Recorder: no start times, so no gaps
        starts = gaps = None
    if gaps is not None and min(gaps) < 0:  # overlapping calls (asynchronous timing): no gap
        _no_overlap(gaps)
    if steps is None and any(name not in known or known[name].steps is None for name in masks):
        steps = list(map(STEP, events))
    ops = list(map(OP, events)) if ops is None else ops
    uneven_ops = "all_to_all" in (ops if kinds is None else kinds)
    sites: list[int] | None = [0] * len(events) if table is not None else None
    groups = []
    where = range(len(events))
    for name, mine in masks.items():
        info = events[mine.index(True)].group
        uneven: tuple[int, ...] = ()
        if uneven_ops:
            a2a = list(map(_and, mine, map("all_to_all".__eq__, ops)))
            uneven = tuple(e.seq for e in compress(events, a2a) if e.seq is not None and not _even(e))
        pos = list(compress(where, mine))
        have = known.get(name) or Known(array("q", compress(seqs, mine)))
        g_seqs = have.seqs
        g_lats = have.lats if have.lats is not None else array("d", list(compress(lats, mine)))  # type: ignore[type-var]
        if sites is not None:
            assert have.sites is not None  # a table comes with every group's sites
            any(map(sites.__setitem__, pos, have.sites))  # each call's site, in its place
        run = g_seqs == array("q", range(g_seqs[0], g_seqs[0] + len(g_seqs)))
        groups.append(GroupPart(name, info.label, info.size, g_seqs, g_lats,
                                None if gaps is None else array("d", list(compress(gaps, mine))), have.steps, pos, run, uneven))
    if sites is None or table is None:
        interned = Interner()
        sites, table = interned.many(map(_SITE, events)), interned.values
    numbers = seqs if None not in seqs else [-1 if q is None else q for q in seqs]
    return LateDigest(rank, groups, Places(sites, table, numbers, starts, steps), times[0], times[1], True)  # type: ignore[arg-type]


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
