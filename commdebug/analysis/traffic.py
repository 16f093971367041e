"""Who sends how much to whom: the traffic between pairs of ranks, ``commdebug summary --by peer``.

Two kinds of calls move data between named pairs: an all_to_all (each member sends its
``send_splits[j]`` to member j of the group, and receives ``recv_splits[i]`` from member i) and a
send/recv (``peer``). One rank's dump knows its own side of each: what it sent, to whom, and what
it received, from whom. A row is one (group, src, dst) pair, ranks global: ``calls`` (all_to_all
calls between them, zero-byte parts counted, and sends), ``bytes``.

A folder holds both sides of every pair; each is counted once, **from the sender's dump**, and
from the receiver's only where the sender's dump is not in the folder (or carries no event of
that pair: a rank with no splits recorded, a Flight Recorder dump without its sends). A single
dump gives its rank's sends and its receives. The diagonal (a member's part of an all_to_all
that stays on it) is a row too.

>>> rows = peer_rows(iter_ranks("traces/"))        # doctest: +SKIP
>>> rows[0]                                         # doctest: +SKIP
PeerRow(group='default_pg[4]', src=0, dst=1, calls=6, bytes=4096, step=None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from commdebug.errors import CommDebugError, DumpError
from commdebug.formats.folders import Dumps, dumps_name, job_files, one_file, rank_from_name
from commdebug.formats.readers import iter_ranks, load_rank
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, Trace, known_bytes

__all__ = ["PeerRow", "PeerTally", "peer_rows", "peer_rows_path", "Imbalance", "ImbalanceTally",
           "received_bytes", "Traffic", "traffic_path"]


@dataclass(frozen=True)
class PeerRow:
    """Traffic from global rank ``src`` to global rank ``dst`` on ``group`` (its label, as other
    summaries name groups): ``calls`` and ``bytes``; ``step`` when counted per step (else None).
    ``unknown``: calls whose size is not known (a trace without shapes), left out of ``bytes``
    (None when no call's size is known)."""

    group: str
    src: int
    dst: int
    calls: int
    bytes: int | None
    step: int | None = None
    unknown: int = 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"group": self.group, "src": self.src, "dst": self.dst, "calls": self.calls, "bytes": self.bytes}
        if self.unknown:
            d["unknown_size"] = self.unknown
        if self.step is not None:
            d["step"] = self.step
        return d


# (group label, step or None, src, dst) -> [calls, bytes, calls of unknown size]
_Key = tuple[str, int | None, int, int]


class PeerTally:
    """Peer rows built one rank at a time (streaming over a folder): :meth:`add` each rank's
    events, then :meth:`rows`. ``by_step``: one row per step as well (a matrix per step).

    >>> tally = PeerTally()
    >>> for view in iter_ranks("traces/"):           # doctest: +SKIP
    ...     tally.add(view.rank, view.events)
    >>> tally.rows()                                 # doctest: +SKIP
    """

    def __init__(self, by_step: bool = False) -> None:
        self.by_step = by_step
        self.sent: dict[_Key, list[int]] = {}  # from the senders' dumps
        self.received: dict[_Key, list[int]] = {}  # from the receivers' dumps
        self.ranks: set[int] = set()

    def add(self, rank: int, events: Iterable[CollectiveEvent]) -> None:
        """One rank's events (its own dump: what it sent and what it received)."""
        self.ranks.add(rank)
        sent, received, by_step = self.sent, self.received, self.by_step
        for e in events:
            step = e.step if by_step else None
            if e.peer is not None and e.op in ("send", "recv"):
                if e.op == "send":
                    _count(sent, (e.group.label, step, rank, e.peer), e.size_bytes)
                else:
                    _count(received, (e.group.label, step, e.peer, rank), e.size_bytes)
                continue
            if e.send_splits is None and e.recv_splits is None:
                continue
            members = e.group.ranks
            if not members:
                continue
            label = e.group.label
            if e.send_splits is not None and len(e.send_splits) == len(members):
                for dst, nbytes in zip(members, e.send_splits, strict=True):
                    _count(sent, (label, step, rank, dst), nbytes)
            if e.recv_splits is not None and len(e.recv_splits) == len(members):
                for src, nbytes in zip(members, e.recv_splits, strict=True):
                    _count(received, (label, step, src, rank), nbytes)

    def rows(self) -> list[PeerRow]:
        """The rows, by group, step, src, dst: the sender's count where the sender's dump gave
        one, else the receiver's (see the module docstring)."""
        counts = dict(self.sent)
        for key, value in self.received.items():
            if key not in counts:
                counts[key] = value
        return [PeerRow(group, src, dst, calls, known_bytes(nbytes, unknown, calls), step, unknown)
                for (group, step, src, dst), (calls, nbytes, unknown) in sorted(counts.items(), key=_order)]


def _order(item: tuple[_Key, list[int]]) -> tuple:
    group, step, src, dst = item[0]
    return (group, -1 if step is None else step, src, dst)


def _count(table: dict[_Key, list[int]], key: _Key, nbytes: int | None) -> None:
    agg = table.get(key)
    if agg is None:
        agg = table[key] = [0, 0, 0]
    agg[0] += 1
    if nbytes is None:
        agg[2] += 1
    else:
        agg[1] += nbytes


def _rank_of(view: Trace | RankView, index: int) -> int:
    if isinstance(view, RankView):
        return view.rank
    rank = view.metadata.get("rank")
    return index if rank is None else int(rank)


def peer_rows(views: Iterable[Trace | RankView], by_step: bool = False) -> list[PeerRow]:
    """The peer rows of a job's ranks (each a :class:`Trace` or :class:`RankView`, taken one at
    a time; a Trace's rank is its ``metadata.rank``, else its place in ``views``)."""
    tally = PeerTally(by_step)
    for index, view in enumerate(views):
        tally.add(_rank_of(view, index), view.events)
    return tally.rows()


def peer_rows_path(path: Dumps, rank: int | None = None, by_step: bool = False,
                   jobs: int | None = 1) -> list[PeerRow]:
    """:func:`peer_rows` of one dump or a folder of rank dumps (ours, streams or Flight
    Recorder's), read by ``jobs`` processes (None: as many as pay); ``rank``: only that rank's
    file of the folder."""
    if rank is None:
        return peer_rows(iter_ranks(path, jobs=jobs), by_step)
    single = one_file(path)
    if single is not None:
        raise CommDebugError(f"{single}: --rank picks one rank out of a folder; this is one dump already")
    files = {rank_from_name(f): f for f in job_files(path)}
    if rank not in files:
        raise DumpError(f"{dumps_name(path)}: no dump or stream of rank {rank}")
    return peer_rows([load_rank(files[rank])], by_step)


def received_bytes(e: CollectiveEvent) -> int | None:
    """What one rank received in an all_to_all call: its receive splits summed where recorded,
    else its output buffer (a Flight Recorder dump, an older dump); None where not known."""
    return sum(e.recv_splits) if e.recv_splits is not None else e.output_bytes


@dataclass(frozen=True)
class Imbalance:
    """How unevenly one step's all_to_all traffic on one group landed: in the step's most uneven
    call, the member that received most (``rank``, global), what it received (``bytes``) and the
    members' mean (``mean_bytes``); ``factor`` = bytes / mean_bytes (1.0: even), None when only
    one member's dump told (one dump cannot say what the others received). ``ranks``: how many
    members' dumps told, of ``group_size``; ``calls``: the step's all_to_all calls on the group."""

    step: int
    group: str
    rank: int
    factor: float | None
    bytes: int
    mean_bytes: float
    module: str
    ranks: int
    group_size: int
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "group": self.group, "rank": self.rank, "factor": self.factor, "bytes": self.bytes,
                "mean_bytes": self.mean_bytes, "module": self.module, "ranks": self.ranks, "group_size": self.group_size,
                "calls": self.calls}


class ImbalanceTally:
    """:class:`Imbalance` rows built one rank at a time: :meth:`add` each rank's events, then
    :meth:`rows`. Calls pair across ranks by (group, sequence number); per call it keeps the
    received bytes' sum, count and maximum (with the rank and module holding it), so memory
    grows with the calls, not with ranks x calls.

    >>> tally = ImbalanceTally()
    >>> for view in iter_ranks("traces/"):           # doctest: +SKIP
    ...     tally.add(view.rank, view.events)
    >>> tally.rows()[0].factor                       # doctest: +SKIP
    2.6
    """

    def __init__(self) -> None:
        # (group name, seq) -> [step, label, group size, ranks told, sum, max, rank of max, module of max]
        self.calls: dict[tuple[str, int], list[Any]] = {}

    def add(self, rank: int, events: Iterable[CollectiveEvent]) -> None:
        """One rank's events (its own dump: what it received at each all_to_all)."""
        calls = self.calls
        for e in events:
            if e.op != "all_to_all" or e.seq is None:
                continue
            got = received_bytes(e)
            if got is None:  # a size not known: no imbalance can be told from it
                continue
            key = (e.group.name, e.seq)
            c = calls.get(key)
            if c is None:
                calls[key] = [e.step, e.group.label, e.group.size, 1, got, got, rank, e.module]
                continue
            c[3] += 1
            c[4] += got
            if got > c[5] or (got == c[5] and rank < c[6]):
                c[5], c[6], c[7] = got, rank, e.module

    def rows(self) -> list[Imbalance]:
        """One row per (step, group): its most uneven call (highest factor; with one member's
        dump, its largest receive), worst first: factor, then bytes."""
        best: dict[tuple[int, str], tuple[Imbalance, int]] = {}  # (step, group name) -> (row, calls)
        for (name, _), (step, label, size, told, total, top, rank, module) in self.calls.items():
            mean = total / told
            factor = top / mean if told > 1 and mean > 0 else (1.0 if told > 1 else None)
            row = Imbalance(step, label, rank, factor, top, mean, module, told, size, 1)
            prev = best.get((step, name))
            if prev is None:
                best[(step, name)] = (row, 1)
            else:
                old, n = prev
                best[(step, name)] = (row if _worse(row, old) else old, n + 1)
        out = [dataclasses.replace(row, calls=n) for row, n in best.values()]
        out.sort(key=lambda r: (r.factor is None, -(r.factor or 0.0), -r.bytes, r.step, r.group))
        return out


def _worse(a: Imbalance, b: Imbalance) -> bool:
    return ((a.factor or 0.0), a.bytes) > ((b.factor or 0.0), b.bytes)


@dataclass(frozen=True)
class Traffic:
    """A job's traffic in one read: its peer rows (per step when asked) and its all_to_all
    imbalance rows (worst first)."""

    peers: list[PeerRow]
    imbalance: list[Imbalance]


def traffic_path(path: Dumps, by_step: bool = False, jobs: int | None = 1) -> Traffic:
    """:func:`peer_rows_path` and the all_to_all imbalance rows (:class:`ImbalanceTally`) of one dump or a folder, reading each
    rank once (``jobs`` processes, as there).

    >>> t = traffic_path("traces/", by_step=True)    # doctest: +SKIP
    >>> t.imbalance[0].step, t.imbalance[0].rank      # doctest: +SKIP
    (2, 0)
    """
    peers, a2a = PeerTally(by_step), ImbalanceTally()
    for index, view in enumerate(iter_ranks(path, jobs=jobs)):
        rank = _rank_of(view, index)
        events = view.events
        peers.add(rank, events)
        a2a.add(rank, events)
    return Traffic(peers.rows(), a2a.rows())
