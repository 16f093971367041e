"""Summaries of a trace's collectives: per op, per op and message size (DeepSpeed's
``log_summary``), per op and power-of-two size bin (mpitrace's distribution), per module, group
or step, with times and bandwidths when the run was timed.

Pure functions of a :class:`~commdebug.model.trace.Trace`, so a live run and a dump give the
same numbers. Bandwidths follow nccl-tests: algbw = S / t, busbw = algbw x the op's factor (see
docs/collectives.md), in GB/s (1e9 bytes/s); an aggregate row's algbw is its bytes over its time,
and p50/p90/p99 are percentiles of the per-call busbw (linear interpolation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from commdebug.errors import CommDebugError
from commdebug.model.trace import CollectiveEvent, Trace
from commdebug.units import format_bytes

__all__ = ["BY", "SummaryRow", "Summary", "summarize", "parse_by"]

# grouping name -> (column names, key of one event)
BY: dict[str, tuple[tuple[str, ...], Callable[[CollectiveEvent], tuple]]] = {
    "op": (("op",), lambda e: (e.op,)),
    "op,size": (("op", "size_bytes"), lambda e: (e.op, e.size_bytes)),
    "op,bin": (("op", "size_bin"), lambda e: (e.op, _bin(e.size_bytes))),
    "module": (("module",), lambda e: (e.module,)),
    "group": (("group",), lambda e: (e.group.label,)),
    "step": (("step",), lambda e: (e.step,)),
    "phase": (("phase",), lambda e: (e.phase,)),
}


def parse_by(by: str) -> str:
    """Normalise a ``by`` argument (``"op, size"`` -> ``"op,size"``), or a clear error."""
    key = ",".join(part.strip() for part in str(by).split(","))
    if key not in BY:
        raise CommDebugError(f"unknown summary grouping {by!r} (choose from: {', '.join(BY)})")
    return key


def _bin(size: int) -> tuple[int, int]:
    """mpitrace-style power-of-two bin [lo, hi) of a message size; (0, 0) for empty messages."""
    if size <= 0:
        return (0, 0)
    lo = 1 << (size.bit_length() - 1)
    return (lo, lo * 2)


def bin_label(bounds: tuple[int, int]) -> str:
    lo, hi = bounds
    return "0 B" if hi == 0 else f"{format_bytes(lo)} - {format_bytes(hi)}"


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class SummaryRow:
    """One row: the grouping values, then counts, bytes, and (when timed) times and bandwidths."""

    key: dict[str, Any]
    calls: int = 0
    bytes: int = 0
    timed_calls: int = 0
    time_s: float | None = None
    avg_time_s: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    busbw_p50_gbps: float | None = None
    busbw_p90_gbps: float | None = None
    busbw_p99_gbps: float | None = None
    # predicted on a target cluster (commdebug.estimate), never mixed with the measured ones
    predicted_s: float | None = None
    predicted_busbw_gbps: float | None = None

    def to_dict(self, predicted: bool = True) -> dict[str, Any]:
        """Grouping keys then figures; the predicted keys only when ``predicted``."""
        out = dict(self.key)
        out.update({k: v for k, v in asdict(self).items() if k != "key" and (predicted or k not in _PREDICTED)})
        return out


_PREDICTED = frozenset({"predicted_s", "predicted_busbw_gbps"})


@dataclass
class Summary:
    """Rows plus the run's header: elapsed time, communication time and its share."""

    by: str
    rows: list[SummaryRow]
    header: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form; keys are documented in docs/summary.md and kept stable."""
        predicted = "cluster" in self.header
        return {"by": self.by, "header": self.header, "rows": [r.to_dict(predicted) for r in self.rows]}


def summarize(trace: Trace, by: str = "op", cluster: Any = None, ranks_per_node: int | None = None) -> Summary:
    """Summarise a trace's collective events grouped ``by`` one of :data:`BY`.

    ``cluster`` (a preset name, cluster file, dict or :class:`~commdebug.estimate.Cluster`;
    default: the dump's ``metadata.cluster``, if any) adds the predicted time and busbw of each
    row on that cluster (docs/estimate.md).

    >>> print(render_summary(summarize(comm.trace, "op,size")))   # doctest: +SKIP
    """
    by = parse_by(by)
    columns, key_of = BY[by]
    from commdebug.estimate import predict_trace

    prediction = predict_trace(trace, cluster, ranks_per_node=ranks_per_node)
    predicted = prediction.seconds if prediction is not None else [None] * len(trace.events)
    groups: dict[tuple, list[tuple[CollectiveEvent, float | None]]] = {}
    for event, seconds in zip(trace.events, predicted):
        groups.setdefault(key_of(event), []).append((event, seconds))
    rows = [_row(dict(zip(columns, key)), events) for key, events in groups.items()]
    rows.sort(key=_order(by))
    if by == "op,bin":
        for row in rows:
            row.key["size_bin"] = bin_label(row.key["size_bin"])
    header = _header(trace)
    if prediction is not None:
        header["cluster"] = prediction.cluster.name
        header["predicted_s"] = prediction.total_s
        header["prediction_notes"] = prediction.notes
    return Summary(by, rows, header)


def _order(by: str) -> Callable[[SummaryRow], Any]:
    if by in ("op,size", "op,bin", "step"):  # by op, then size; steps in order
        columns = BY[by][0]
        return lambda r: tuple(r.key[c] for c in columns)
    # heaviest first: time when timed, else bytes, then calls
    return lambda r: (-(r.time_s or 0.0), -r.bytes, -r.calls, str(list(r.key.values())))


def _row(key: dict[str, Any], events: Iterable[tuple[CollectiveEvent, float | None]]) -> SummaryRow:
    row = SummaryRow(key)
    timed_bytes = 0
    bus_bytes = 0.0
    busbws: list[float] = []
    total_t = 0.0
    pred_t = pred_bus = 0.0
    predicted = False
    for e, seconds in events:
        if seconds is not None:
            predicted = True
            pred_t += seconds
            pred_bus += e.size_bytes * e.busbw_factor
        row.calls += 1
        row.bytes += e.size_bytes
        if e.latency_s is not None:
            row.timed_calls += 1
            total_t += e.latency_s
            timed_bytes += e.size_bytes
            bus_bytes += e.size_bytes * e.busbw_factor
            if e.busbw_gbps is not None:
                busbws.append(e.busbw_gbps)
    if row.timed_calls:
        row.time_s = total_t
        row.avg_time_s = total_t / row.timed_calls
        if total_t > 0:
            row.algbw_gbps = timed_bytes / total_t / 1e9
            row.busbw_gbps = bus_bytes / total_t / 1e9
        busbws.sort()
        row.busbw_p50_gbps = _percentile(busbws, 0.50)
        row.busbw_p90_gbps = _percentile(busbws, 0.90)
        row.busbw_p99_gbps = _percentile(busbws, 0.99)
    if predicted:
        row.predicted_s = pred_t
        row.predicted_busbw_gbps = pred_bus / pred_t / 1e9 if pred_t > 0 else None
    return row


def _header(trace: Trace) -> dict[str, Any]:
    meta = trace.metadata
    timed = [e.latency_s for e in trace.events if e.latency_s is not None]
    comm_s = sum(timed) if timed else None
    recorded = meta.get("recorded_s", meta.get("elapsed_s"))
    header: dict[str, Any] = {
        "rank": meta.get("rank"),
        "world_size": meta.get("world_size"),
        "hostname": meta.get("hostname"),
        "timing": meta.get("timing", "off" if not timed else "sync"),
        "steps": trace.steps,
        "collectives": len(trace.events),
        "bytes": sum(e.size_bytes for e in trace.events),
        "timed_collectives": len(timed),
        "elapsed_s": meta.get("elapsed_s"),
        "recorded_s": recorded,
        "comm_time_s": comm_s,
        "comm_share": comm_s / recorded if comm_s is not None and recorded else None,
        "events_dropped": trace.events_dropped,
        "timing_notes": list(meta.get("timing_notes") or []),
    }
    return header
