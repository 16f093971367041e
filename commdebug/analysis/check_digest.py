"""One rank's share of ``commdebug check``: what the check keeps of a rank once it is read
(:class:`RankDigest`, made by :func:`rank_digest`), and how its recording ended
(:class:`RankSummary`). A folder read by worker processes has the digests made there, so the
process that merges them handles a few arrays per group, not every event
(:mod:`commdebug.analysis.check` merges them; docs/large-jobs.md)."""

from __future__ import annotations

import os
import socket
from array import array
from dataclasses import dataclass
from itertools import compress
from operator import and_ as _and, gt as _gt
from typing import Any

from commdebug.analysis.died_in import DiedIn
from commdebug.analysis.divergence import UNKNOWN_STEP
from commdebug.analysis.findings import Finding, Side
from commdebug.analysis.late_digest import LATE_IN_C, Known, LateDigest, late_digest
from commdebug.model.columns import (
    CALL,
    GROUP_NAME,
    GROUP_SIZE,
    IN_FLIGHT,
    INPUT_BYTES,
    IS_NOT_NONE,
    LATENCY,
    OP,
    OUTPUT_BYTES,
    SEQ,
    STEP,
)
from commdebug.model.fault import ending_note
from commdebug.model.presence import Placement, placement_of
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.ops import needs_all, shape_rule
from commdebug.units import format_bytes

__all__ = ["LastCall", "RankSummary", "RankDigest", "rank_digest", "shape_finding", "process_alive", "completed_seqs"]



@dataclass(frozen=True)
class LastCall:
    """A rank's last recorded call: a collective (``seq``) or a send/recv (``peer``, ``p2p_seq``)."""

    op: str
    group: str  # label
    seq: int | None
    source: str | None
    module: str | None
    in_flight: bool
    peer: int | None = None
    p2p_seq: int | None = None
    step: int | None = None
    failed: bool = False  # it raised (its error is in the dump): a rank's ending often names it


@dataclass
class RankSummary:
    """How one rank's recording ended and where it was: kept for every rank, so small."""

    rank: int
    file: str
    ended_by: str | None  # metadata.ended_by: exit, sys.exit(3), SIGTERM, hang, RuntimeError: ...
    source_format: str
    collectives: int
    last: LastCall | None
    # a rank that left only its stream (its process ended without a final dump, or still runs): the step it was in at its
    # last chunk, and whether its last chunk was torn
    stream_step: int | None = None
    stream_torn: bool = False
    # whether its process still runs, where that can be known (this host): None elsewhere
    stream_alive: bool | None = None
    # its fault record (metadata.fault: a fatal signal ended its process), None without one
    fault: dict[str, Any] | None = None
    # its collectives on no known group (a gloo torch.profiler trace names none): not compared
    ungrouped: int = 0
    # where its program raised (metadata.raised_at: {"file", "line", "function"}), when it did
    raised_at: dict[str, Any] | None = None
    # a rank whose record may lack its last calls (no final dump): the call the evidence says it
    # was last in (its peers' records, its fault record's line); set by the check over all ranks
    died_in: DiedIn | None = None

    @property
    def final(self) -> bool:
        """Whether its record is a final dump (written once its program ended: complete), not a
        stream or a hang dump, which may lack what the rank did last."""
        return self.ended_by not in (None, "hang")

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["last"] = None if self.last is None else dict(self.last.__dict__)
        d["died_in"] = None if self.died_in is None else self.died_in.to_dict()
        return d

def _unknown(name: str) -> GroupInfo:
    return GroupInfo(name, "", 0, None)


def shape_finding(rank: int, seq: int, e: CollectiveEvent, step: int | None) -> Finding | None:
    """A collective whose sizes break its op's shape rule (not a balanced one: all_to_all's are
    checked across ranks), as a finding."""
    n = e.group.size
    rule = shape_rule(e.op)
    if n <= 0 or rule is None or rule.balanced:
        return None
    whole_shapes = e.output_shapes if rule.whole == "output" else e.input_shapes
    if rule.whole_may_be_list and e.key.startswith("fr:") and len(whole_shapes) != 1:
        return None
    if e.input_bytes is None or e.output_bytes is None:  # sizes not known: no rule to break
        return None
    bad = rule.mismatch(e.input_bytes, e.output_bytes, n)
    if bad is None:
        return None
    whole, part = bad
    return Finding("shape", e.group.label, seq,
                   f"{e.op} on rank {rank}: {rule.whole} {format_bytes(whole)} is not group size {n} x {rule.part} {format_bytes(part)}",
                   [Side([rank], e.op, e.size_bytes, e.dtype, e.module, e.source, e.in_flight)], step=step)


@dataclass
class RankDigest:
    """One rank's share of the check, small and picklable: what the check keeps of a rank once
    it is read. A folder read by worker processes has them made there (``read_all(...,
    digest=rank_digest)``), so the reading process handles a few arrays per group, not ten
    thousand events; either way the check sees the same digests, so the same result."""

    rank: int
    world_size: int
    notes: list[str]
    # in call order: shape findings, (seq, event, step) of balanced ops (all_to_all: checked
    # against the other ranks), (None, event, step) of paired sends and receives
    specials: list[Any]
    calls: list[tuple]  # the distinct (op, size, dtype, module, source), first seen first
    # per group, in first-call order: (info, seqs, call ids (into calls), steps, positions of
    # unfinished calls, whether its last call is unfinished); seqs sorted
    groups: list[tuple[GroupInfo, array, array, array, frozenset[int], bool]]
    idle: list[tuple[str, GroupInfo]]  # groups it is a member of and issued nothing on
    # group -> (the last seq this rank's record shows completed, info): Flight Recorder's
    # pg_status, or the last call of an op that needs every member (ops.needs_all) that a dump
    # marking its unfinished calls shows finished; every member issued it and all before it
    completed: dict[str, tuple[int, GroupInfo]]
    summary: RankSummary
    late: LateDigest  # its share of the late-rank analysis
    placement: Placement = Placement(None)  # its host and node: a missing rank may be on another node


def rank_digest(view: RankView) -> RankDigest:
    """The :class:`RankDigest` of one rank (what a worker process returns for ``check``).

    Column at a time where it can (a rank's ten thousand calls have a few dozen distinct
    values): the shape rules are judged once per distinct (op, bytes, group size), the calls
    split by group and turned into ids in C; only the odd calls (sends and receives, all_to_all,
    shape findings) are looked at one by one."""
    rank = view.rank
    events = view.events
    pair_p2p = view.source_format == "commdebug"
    steps_known = view.source_format != "flight-recorder"
    seqs_all = list(map(SEQ, events))
    ops = list(map(OP, events))
    kinds = set(ops)
    odd_ops = {op for op in kinds if (r := shape_rule(op)) is not None and r.balanced}
    shapes = set(zip(ops, map(INPUT_BYTES, events), map(OUTPUT_BYTES, events), map(GROUP_SIZE, events), strict=True))
    suspect = odd_ops | {op for op, i, o, n in shapes if op not in odd_ops and n > 0 and i is not None and o is not None
                         and (r := shape_rule(op)) is not None and r.mismatch(i, o, n) is not None}
    specials: list[Any] = []
    if suspect or None in seqs_all:  # one by one, in call order
        for e, seq, op in zip(events, seqs_all, ops, strict=True):
            step = e.step if steps_known else None
            if seq is None:
                if pair_p2p and e.peer is not None and e.p2p_seq is not None and op in ("send", "recv"):
                    specials.append((None, e, step))
            elif op in odd_ops:
                if e.group.size > 0:
                    specials.append((seq, e, step))
            elif op in suspect:
                finding = shape_finding(rank, seq, e, step)
                if finding is not None:
                    specials.append(finding)
    names = list(map(GROUP_NAME, events))
    with_seq = list(map(IS_NOT_NONE, seqs_all))
    # the late-rank analysis in Python takes the groups' columns made here where they are its own:
    # every call timed, each group's calls in call order (and the site of every call: each has a
    # number); the C one reads the events
    lats = list(map(LATENCY, events)) if not LATE_IN_C else None
    late_masks: dict[str, list[bool]] | None = {} if lats is not None and None not in lats else None
    known: dict[str, Known] = {}
    calls: dict[tuple, int] = {}
    groups = []
    issued = 0
    for name in dict.fromkeys(compress(names, with_seq)):  # in first-call order
        mask = list(map(_and, map(name.__eq__, names), with_seq))
        mine = list(compress(events, mask))
        seqs = list(map(SEQ, mine))
        in_order = not any(map(_gt, seqs, seqs[1:]))
        if not in_order:
            mine.sort(key=SEQ)
            seqs = list(map(SEQ, mine))
        call_of = list(map(CALL, mine))
        for c in dict.fromkeys(call_of):
            calls.setdefault(c, len(calls))
        steps = list(map(STEP, mine)) if steps_known else [UNKNOWN_STEP] * len(mine)
        own_steps = steps_known
        if None in steps:  # a dump written without steps
            steps = [UNKNOWN_STEP if s is None else s for s in steps]
            own_steps = False
        flight = frozenset(compress(range(len(mine)), map(IN_FLIGHT, mine))) if any(map(IN_FLIGHT, mine)) else frozenset()
        group = (view.groups.get(name) or mine[0].group, array("q", seqs), array("i", map(calls.__getitem__, call_of)), array("q", steps),
                 flight, mine[-1].in_flight)
        groups.append(group)
        issued += len(mine)
        if late_masks is not None:
            late_masks[name] = mask
            if in_order:
                known[name] = Known(group[1], None, group[3] if own_steps else None, group[2])
    table = [(c[0], c[3], c[4]) for c in calls] if late_masks is not None and len(known) == len(late_masks) and None not in seqs_all else None
    by_group = set(compress(names, with_seq))
    idle = [(name, info) for name, info in view.groups.items() if name not in by_group and info.ranks and rank in info.ranks]
    completed = {name: (seq, view.groups.get(name) or _unknown(name))
                 for name, seq in completed_seqs(view, seqs_all, ops, names).items()}
    notes = list(view.notes)
    fault = view.metadata.get("fault")
    if isinstance(fault, dict) and fault.get("after_final_dump"):  # the gloo teardown abort: a note on a complete dump
        notes.append(ending_note(view.metadata) or "")
    late = late_digest(rank, events, lats=lats, seqs=seqs_all, ops=ops, names=names, masks=late_masks, known=known, table=table,
                       kinds=kinds, starts=False)
    return RankDigest(rank, int(view.metadata.get("world_size") or 0), notes, specials, list(calls), groups,
                      idle, completed, _summary(view, issued), late, placement_of(view.metadata))


def completed_seqs(view: RankView, seqs: list[int | None] | None = None, ops: list[str] | None = None,
                   names: list[str] | None = None) -> dict[str, int]:
    """Per group, the last sequence number this rank's record shows completed: Flight Recorder's
    pg_status, or the last finished call of an op that needs every member (so every member issued
    it and all before it), in a dump that flagged its unfinished calls when written (not a stream,
    which may carry the flag after a hang dump but flags a call only once it has been unfinished
    2 s). ``seqs``, ``ops``, ``names``: the events' columns, where already made."""
    completed = dict(view.completed)
    if view.metadata.get("unfinished_marked") and not isinstance(view.metadata.get("stream"), dict):
        events = view.events
        found = _finished(events, list(map(SEQ, events)) if seqs is None else seqs, list(map(OP, events)) if ops is None else ops,
                          list(map(GROUP_NAME, events)) if names is None else names)
        for name, seq in found.items():
            if seq > completed.get(name, -1):
                completed[name] = seq
    return completed


def _finished(events: list[CollectiveEvent], seqs: list[int | None], ops: list[str], names: list[str]) -> dict[str, int]:
    """Per group, the seq of the last call of an op that needs every member (ops.needs_all)
    that finished (not flagged in_flight, no error), in a dump that flags its unfinished calls.
    Events are in call order: read from the end, a group's first hit is its last."""
    proving = {op for op in set(ops) if needs_all(op)}
    found: dict[str, int] = {}
    if not proving:
        return found
    groups = len(set(names))
    for i in range(len(events) - 1, -1, -1):
        seq, name = seqs[i], names[i]
        if seq is None or name in found or ops[i] not in proving:
            continue
        e = events[i]
        if not e.in_flight and e.error is None:
            found[name] = seq
            if len(found) == groups:
                break
    return found


def _summary(view: RankView, collectives: int) -> RankSummary:
    """How the rank ended and its last call (events are in call order)."""
    last = None
    if view.events:
        e = view.events[-1]
        last = LastCall(e.op, e.group.label, e.seq, e.source, e.module if e.module != "?" else None, e.in_flight,
                        e.peer, e.p2p_seq, e.step, e.error is not None)
    ended = view.metadata.get("ended_by")
    stream = view.metadata.get("stream")
    summary = RankSummary(view.rank, str(view.path), None if ended is None else str(ended), view.source_format, collectives, last)
    summary.ungrouped = sum(1 for e in view.events if e.seq is None and e.group.name == "?" and e.op not in ("send", "recv"))
    fault = view.metadata.get("fault")
    summary.fault = fault if isinstance(fault, dict) else None
    raised = view.metadata.get("raised_at")
    summary.raised_at = raised if isinstance(raised, dict) else None
    if isinstance(stream, dict):
        summary.stream_step = int(stream.get("step") or 0)
        summary.stream_torn = bool(stream.get("torn"))
        summary.stream_alive = process_alive(view.metadata)
    return summary


def process_alive(meta: dict[str, Any]) -> bool | None:
    """Whether the process that wrote a stream still runs, asked of this host's kernel when the
    stream was written here; None when it was written on another host (or names no pid). A
    file's times cannot tell: a rank killed a second ago and a live one look the same."""
    pid, host = meta.get("pid"), meta.get("hostname")
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process by that number
        return True
    return True
