"""Measured time per call from timed dumps: ours (``commdebug run --timing``,
``CommDebugMode(timing=...)``: events carry ``latency_s``) or Flight Recorder's with durations.

A collective's measured time is its **shortest latency over the ranks**: every rank's latency
runs from its own call to the end, so a rank that arrived early also waited for the others; the
last one to arrive waited for nobody, and its latency is the collective's own duration. Calls are
matched across ranks by (group, sequence number); a send and its recv by (group, sender,
receiver, n-th message between them).

>>> job = timed_calls(iter_ranks("traces/"))        # doctest: +SKIP
>>> job.calls[0].seconds, job.calls[0].ranks_timed  # doctest: +SKIP
(0.000113, 4)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from commdebug import ops
from commdebug.estimate.alpha_beta import effective_size
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo, Trace

__all__ = ["TimedCall", "TimedJob", "timed_calls"]


@dataclass
class TimedCall:
    """One call as the job made it: the event as the lowest timed rank recorded it (its group's
    ranks filled in where the dump did not list them; an all_to_all with splits carries its
    busiest member's, which bound its time), that rank, and the measured seconds."""

    event: CollectiveEvent
    rank: int
    seconds: float
    ranks_timed: int


@dataclass
class TimedJob:
    """The timed calls of a job (in the lowest rank's order), where each rank ran, and counts."""

    calls: list[TimedCall]
    hosts: dict[int, str | None]  # rank -> hostname (None: the dump does not say)
    ranks: int
    untimed: int = 0  # calls no rank timed (or in flight, or failed)
    metadata: dict[str, Any] = field(default_factory=dict)  # the lowest rank's
    notes: list[str] = field(default_factory=list)
    source: str = ""  # where it was read from (a folder or file), for the notes


def _key(e: CollectiveEvent, rank: int, ordinal: dict[tuple, int]) -> tuple:
    """What names the same call on every rank that took part in it."""
    k: tuple
    if e.peer is not None:
        sender, receiver = (rank, e.peer) if e.op == "send" else (e.peer, rank)
        if e.p2p_seq is not None:
            return ("p2p", e.group.name, sender, receiver, e.p2p_seq)
        k = ("p2p", e.group.name, sender, receiver)
    elif e.seq is not None:
        return ("c", e.group.name, e.seq)
    else:
        k = ("n", e.group.name, e.op)
    ordinal[k] = ordinal.get(k, -1) + 1
    return (*k, "#", ordinal[k])


def timed_calls(views: Iterable[RankView | Trace], source: str = "") -> TimedJob:
    """The job's timed calls, each with its shortest latency over the ranks that timed it (one
    file: that rank's own latencies). Groups whose ranks a dump does not list (Flight Recorder on
    gloo) get the ranks that recorded calls on them, and their message sizes are recomputed with
    that group size."""
    best: dict[tuple, list] = {}  # key -> [seconds, rank, event, ranks timed]
    busiest: dict[tuple, CollectiveEvent] = {}  # all_to_all key -> the event of its busiest member
    order: list[tuple] = []
    hosts: dict[int, str | None] = {}
    members: dict[str, set[int]] = {}
    untimed_keys: set[tuple] = set()
    metadata: dict[str, Any] = {}
    notes: list[str] = []
    for index, view in enumerate(views):
        rank = _rank(view, index)
        if not hosts or rank < min(hosts):
            metadata = dict(view.metadata)
        hosts[rank] = view.metadata.get("hostname")
        for note in getattr(view, "notes", []):
            if note not in notes:
                notes.append(note)
        ordinal: dict[tuple, int] = {}
        for e in view.events:
            members.setdefault(e.group.name, set()).add(rank)
            key = _key(e, rank, ordinal)
            if e.send_splits is not None or e.recv_splits is not None:
                heavy = busiest.get(key)
                if heavy is None or effective_size(e) > effective_size(heavy):
                    busiest[key] = e
            t = e.latency_s
            if not t or t <= 0 or e.in_flight or e.error:
                untimed_keys.add(key)
                continue
            got = best.get(key)
            if got is None:
                best[key] = [t, rank, e, 1]
                order.append(key)
            else:
                got[3] += 1
                if t < got[0]:
                    got[0] = t
                if rank < got[1]:  # the lowest rank's event stands for the call
                    got[1], got[2] = rank, e
    groups: dict[str, GroupInfo] = {}
    calls = []
    for key in sorted(order, key=lambda k: (best[k][1], best[k][2].index)):
        seconds, rank, e, n = best[key]
        heavy = busiest.get(key)
        if heavy is not None and heavy is not e:
            e = e._replace(send_splits=heavy.send_splits, recv_splits=heavy.recv_splits)
        calls.append(TimedCall(_with_members(e, members, groups), rank, seconds, n))
    untimed = len(untimed_keys - set(best))
    return TimedJob(calls, hosts, len(hosts), untimed, metadata, notes, source)


def _rank(view: RankView | Trace, index: int) -> int:
    rank = getattr(view, "rank", None)
    if rank is None:
        rank = view.metadata.get("rank")
    return index if rank is None else int(rank)


def _with_members(e: CollectiveEvent, members: dict[str, set[int]], groups: dict[str, GroupInfo]) -> CollectiveEvent:
    """The event with its group's ranks, from the ranks that recorded it where the dump has none;
    its message size and factor recomputed when the group's size was unknown."""
    g = e.group
    if g.ranks is not None or e.peer is not None:
        return e
    info = groups.get(g.name)
    if info is None:
        ranks = tuple(sorted(members.get(g.name, ())))
        if g.size and len(ranks) != g.size:  # not every member's dump is here: keep 0..size-1
            return e
        info = groups[g.name] = GroupInfo(g.name, g.desc, len(ranks), ranks)
    if g.size == info.size:
        return e._replace(group=info)
    spec = ops.spec_for_op(e.op)
    if spec is None:
        return e._replace(group=info)
    if e.input_bytes is None or e.output_bytes is None:  # a size not known stays so
        return e._replace(group=info, busbw_factor=spec.busbw_factor(info.size))
    size = ops.MESSAGE_SIZE[spec.size](e.input_bytes, e.output_bytes, info.size)
    return e._replace(group=info, size_bytes=size, busbw_factor=spec.busbw_factor(info.size))
