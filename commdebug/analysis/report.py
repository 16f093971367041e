"""The job across ranks: ``commdebug report``.

- per rank: host, collectives, bytes, communication time (sum of latencies), elapsed and
  recorded time and the communication share; with min / median / max over ranks and which rank
  holds each, as mpitrace prints them;
- per op across all ranks: calls, bytes, time, algbw and busbw (bytes over time);
- straggler effect: for each call, its latency on a rank minus the least latency of the same
  call on any rank of its group, pairing calls by (process group, sequence number), summed per
  op and per rank. A rank that arrives late makes the others wait: their latencies hold the
  wait, its own does not, so a large straggler effect on a rank says it waited for others.

It streams: per rank it keeps its totals and, for timed collectives, compact arrays of (group,
sequence number, latency), so the pairing needs one pass over the dumps.
"""

from __future__ import annotations

import os
import statistics
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable

from commdebug.model.ranks import RankView, iter_ranks

__all__ = ["RankStats", "OpStats", "Report", "report", "report_path"]


@dataclass
class RankStats:
    rank: int
    host: str | None
    collectives: int = 0
    bytes: int = 0
    timed: int = 0
    comm_time_s: float | None = None
    elapsed_s: float | None = None
    recorded_s: float | None = None
    straggler_s: float | None = None

    @property
    def share(self) -> float | None:
        return self.comm_time_s / self.recorded_s if self.comm_time_s is not None and self.recorded_s else None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["share"] = self.share
        return d


@dataclass
class OpStats:
    op: str
    calls: int = 0
    bytes: int = 0
    timed: int = 0
    time_s: float = 0.0
    bus_bytes: float = 0.0  # sum of S x factor over timed calls
    timed_bytes: int = 0
    straggler_s: float = 0.0

    @property
    def algbw_gbps(self) -> float | None:
        return self.timed_bytes / self.time_s / 1e9 if self.time_s > 0 else None

    @property
    def busbw_gbps(self) -> float | None:
        return self.bus_bytes / self.time_s / 1e9 if self.time_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "calls": self.calls, "bytes": self.bytes, "timed_calls": self.timed,
            "time_s": self.time_s if self.timed else None, "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps, "straggler_s": self.straggler_s if self.timed else None,
        }


@dataclass
class Report:
    ranks: list[RankStats]
    ops: list[OpStats]
    timed: bool
    notes: list[str] = field(default_factory=list)

    def spread(self, attribute: str) -> dict[str, Any] | None:
        """min / median / max of a per-rank figure, with the ranks holding min and max."""
        values = [(getattr(r, attribute), r.rank) for r in self.ranks if getattr(r, attribute) is not None]
        if not values:
            return None
        lo, hi = min(values), max(values, key=lambda v: (v[0], -v[1]))
        return {"min": lo[0], "min_rank": lo[1], "median": statistics.median(v for v, _ in values), "max": hi[0], "max_rank": hi[1]}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "spread": {a: self.spread(a) for a in ("collectives", "bytes", "comm_time_s", "elapsed_s", "share", "straggler_s")},
            "ops": [o.to_dict() for o in self.ops],
            "timed": self.timed,
            "notes": self.notes,
        }


def report(ranks: Iterable[RankView]) -> Report:
    """Report on a job's ranks (see the module docstring)."""
    stats: list[RankStats] = []
    ops: dict[str, OpStats] = {}
    groups: dict[str, int] = {}
    op_ids: dict[str, int] = {}
    timed_calls: list[tuple[int, array, array, array, array]] = []  # rank, group, seq, op, latency
    notes: list[str] = []
    for view in ranks:
        meta = view.metadata
        s = RankStats(view.rank, meta.get("hostname"), elapsed_s=meta.get("elapsed_s"), recorded_s=meta.get("recorded_s", meta.get("elapsed_s")))
        g_col, s_col, o_col, l_col = array("i"), array("q"), array("i"), array("d")
        total_t = 0.0
        for e in view.events:
            s.collectives += 1
            s.bytes += e.size_bytes
            o = ops.get(e.op)
            if o is None:
                o = ops[e.op] = OpStats(e.op)
            o.calls += 1
            o.bytes += e.size_bytes
            if e.latency_s is not None:
                s.timed += 1
                total_t += e.latency_s
                o.timed += 1
                o.time_s += e.latency_s
                o.timed_bytes += e.size_bytes
                o.bus_bytes += e.size_bytes * e.busbw_factor
                if e.seq is not None:
                    g_col.append(groups.setdefault(e.group.name, len(groups)))
                    s_col.append(e.seq)
                    o_col.append(op_ids.setdefault(e.op, len(op_ids)))
                    l_col.append(e.latency_s)
        if s.timed:
            s.comm_time_s = total_t
            timed_calls.append((view.rank, g_col, s_col, o_col, l_col))
        notes.extend(f"rank {view.rank}: {n}" for n in view.notes)
        stats.append(s)
    _stragglers(stats, ops, op_ids, timed_calls)
    stats.sort(key=lambda r: r.rank)
    op_rows = sorted(ops.values(), key=lambda o: (-o.time_s, -o.bytes, o.op))
    return Report(stats, op_rows, any(r.timed for r in stats), notes)


def _stragglers(stats: list[RankStats], ops: dict[str, OpStats], op_ids: dict[str, int], calls: list) -> None:
    """Latency minus the least latency of the same (group, seq) call on any rank."""
    least: dict[tuple[int, int], float] = {}
    for _, g_col, s_col, _, l_col in calls:
        for key in zip(g_col, s_col, l_col):
            k = (key[0], key[1])
            if key[2] < least.get(k, float("inf")):
                least[k] = key[2]
    names = {i: op for op, i in op_ids.items()}
    by_rank = {s.rank: s for s in stats}
    for rank, g_col, s_col, o_col, l_col in calls:
        total = 0.0
        for g, seq, o, lat in zip(g_col, s_col, o_col, l_col):
            extra = lat - least[(g, seq)]
            total += extra
            ops[names[o]].straggler_s += extra
        by_rank[rank].straggler_s = total


def report_path(path: str | os.PathLike) -> Report:
    """:func:`report` over a folder of rank dumps (or one dump)."""
    return report(iter_ranks(path))
