"""One rank's share of the late-rank analysis (:mod:`commdebug.analysis.late`): its timed calls'
numbers, latencies and gaps per group, and what names each call, made in the worker process that
read the rank (``report``'s and ``check``'s digests hold one)."""

from __future__ import annotations

import statistics
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import (
    add as _add,
    and_ as _and,
    gt as _gt,
    sub as _sub,
)
from typing import NamedTuple

from commdebug.model.columns import GROUP_NAME, IS_NOT_NONE, LATENCY, MODULE, OP, SEQ, SOURCE, SPLITS, START, STEP
from commdebug.model.trace import CollectiveEvent

__all__ = ["GroupPart", "LateDigest", "late_digest", "step_times", "step_medians"]


class GroupPart(NamedTuple):
    """One rank's timed calls on one group, in call order: parallel columns."""

    name: str
    label: str
    size: int  # members (0: unknown)
    seqs: array  # q
    lats: array  # d
    gaps: array | None  # d; None: no start times
    pos: array  # i: each call's place in the rank's calls (the digest's columns)
    uneven: tuple[int, ...]  # sequence numbers of all_to_all calls left out (uneven or unknown splits)


@dataclass
class LateDigest:
    """One rank's share of the late-rank analysis, small and picklable (see the module
    docstring): per group its timed calls' numbers, latencies and gaps; per call, in call order,
    what names it (op, module, source line, sequence number, step) and when it started. The
    names are the rank's decoded strings, the same objects call after call, so they pickle as
    references; the merge reads them only for the calls where the rank arrived last."""

    rank: int
    groups: list[GroupPart]
    ops: list[str]
    modules: list[str | None]
    sources: list[str | None]
    seqs: array  # q; -1: a send or receive (no sequence number)
    steps: array  # q
    starts: array | None  # d; None: not recorded
    step_list: array  # the steps it timed calls in, ascending, and its time in collectives at each
    step_times: array
    timed: bool  # some call timed


def step_times(t_steps: list[int], t_lats: list[float]) -> tuple[array, array]:
    """A rank's time in collectives per step, from its timed calls' steps and latencies: (the
    steps ascending, the time at each), summed a slice at a time when the steps come in call
    order (always, for a recording)."""
    step_list: list[int] = []
    step_sums: list[float] = []
    if not any(map(_gt, t_steps, t_steps[1:])):
        step_list = list(dict.fromkeys(t_steps))
        for step in step_list:
            step_sums.append(sum(t_lats[bisect_left(t_steps, step):bisect_right(t_steps, step)]))
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
                masks: dict[str, list[bool]] | None = None, paired: dict[str, tuple[array, array]] | None = None) -> LateDigest:
    """The :class:`LateDigest` of one rank's events (in call order), a column at a time.
    `times`: its :func:`step_times`; the columns (``lats``, ``seqs``, ``ops``, ``names``,
    ``steps``: each event's; ``timed``: whether each is; ``masks``: per group, which calls
    are its timed ones with a sequence number; ``paired``: per group, their sequence numbers
    and latencies), when the caller has them already (``report``'s digest does)."""
    lats = list(map(LATENCY, events)) if lats is None else lats
    seqs = list(map(SEQ, events)) if seqs is None else seqs
    timed = list(map(IS_NOT_NONE, lats)) if timed is None else timed
    all_timed = False not in timed
    if masks is None:
        pairable = list(map(_and, timed, map(IS_NOT_NONE, seqs)))
        names = list(map(GROUP_NAME, events)) if names is None else names
        masks = {name: list(map(_and, map(name.__eq__, names), pairable)) for name in dict.fromkeys(compress(names, pairable))}
    if times is None:
        if all_timed:
            times = step_times(list(map(STEP, events)) if steps is None else steps, lats)  # type: ignore[arg-type]
        else:
            times = step_times(list(map(STEP, compress(events, timed))), list(compress(lats, timed)))  # type: ignore[arg-type]
    if not masks:
        return LateDigest(rank, [], [], [], [], array("q"), array("q"), None, times[0], times[1], True in timed)
    starts = list(map(START, events))
    gaps: list[float] | None = None
    if None not in starts:
        # a call's gap: from the end of the call before it (an untimed one ends when it starts)
        gaps = [starts[0], *map(_sub, starts[1:], map(_add, starts, lats if all_timed else [x or 0.0 for x in lats]))]
        if min(gaps) < 0:  # overlapping calls (asynchronous timing): no gap
            gaps = [g if g > 0 else 0.0 for g in gaps]
    ops = list(map(OP, events)) if ops is None else ops
    uneven_ops = "all_to_all" in ops
    groups = []
    where = range(len(events))
    for name, mine in masks.items():
        info = events[mine.index(True)].group
        uneven: tuple[int, ...] = ()
        if uneven_ops:
            a2a = list(map(_and, mine, map("all_to_all".__eq__, ops)))
            uneven = tuple(e.seq for e in compress(events, a2a) if e.seq is not None and not _even(e))
        known = paired.get(name) if paired is not None else None
        g_seqs, g_lats = known if known is not None else (array("q", compress(seqs, mine)), array("d", compress(lats, mine)))  # type: ignore[type-var]
        groups.append(GroupPart(name, info.label, info.size, g_seqs, g_lats, None if gaps is None else array("d", compress(gaps, mine)),
                                array("i", compress(where, mine)), uneven))
    numbers = array("q", seqs) if None not in seqs else array("q", [-1 if q is None else q for q in seqs])  # type: ignore[type-var, arg-type]
    return LateDigest(rank, groups, ops, list(map(MODULE, events)), list(map(SOURCE, events)), numbers,
                      array("q", list(map(STEP, events)) if steps is None else steps), None if gaps is None else array("d", starts),
                      times[0], times[1], True)



def _even(e: CollectiveEvent) -> bool:
    """Whether an all_to_all moved the same bytes to and from every member (splits recorded)."""
    send, recv = SPLITS(e)
    return send is not None and recv is not None and len(set(send)) <= 1 and len(set(recv)) <= 1
