"""Summaries of a trace's collectives: per op, per op and message size (DeepSpeed's
``log_summary``), per op and power-of-two size bin (mpitrace's distribution), per module, group
or step, with times and bandwidths when the run was timed; and the same over a job's rank dumps,
with how each row varies across ranks.

Pure functions of :class:`~commdebug.model.trace.Trace` objects, so a live run and a dump give the
same numbers; data only, the wording is :mod:`commdebug.render.summary`'s. Bandwidths follow
nccl-tests: algbw = S / t, busbw = algbw x the op's factor (see docs/collectives.md), in GB/s
(1e9 bytes/s); an aggregate row's algbw is its bytes over its time, and p50/p90/p99 are
percentiles of the per-call busbw (linear interpolation).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commdebug.analysis.quantiles import Binned, Exact
from commdebug.analysis.shares import share_base
from commdebug.errors import CommDebugError, DumpError
from commdebug.model.aggregates import older_of
from commdebug.model.columns import SIZE
from commdebug.model.presence import Placement, absence, placement_of
from commdebug.model.trace import CollectiveEvent, Trace, known_bytes

if TYPE_CHECKING:
    from commdebug.formats.folders import Dumps

__all__ = ["BY", "RankSpread", "SummaryRow", "Summary", "summarize", "summarize_ranks", "summarize_path",
           "parse_by", "rank_spread", "size_bin"]

# grouping name -> (column names, key of one event)
BY: dict[str, tuple[tuple[str, ...], Callable[[CollectiveEvent], tuple]]] = {
    "op": (("op",), lambda e: (e.op,)),
    "op,size": (("op", "size_bytes"), lambda e: (e.op, e.size_bytes)),
    "op,bin": (("op", "size_bin"), lambda e: (e.op, size_bin(e.size_bytes))),
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


def size_bin(size: int | None) -> tuple[int, int] | None:
    """The mpitrace-style power-of-two bin ``[lo, hi)`` of a message size in bytes; ``(0, 0)``
    for empty messages (a barrier's); None for a size not known, a row of its own.

    >>> size_bin(3000), size_bin(None)
    ((2048, 4096), None)
    """
    if size is None:
        return None
    if size <= 0:
        return (0, 0)
    lo = 1 << (size.bit_length() - 1)
    return (lo, lo * 2)


class _Tally:
    """What one row adds up as its calls come in."""

    __slots__ = ("calls", "bytes", "unknown", "timed", "time_s", "timed_bytes", "sized_s", "bus_bytes", "bus_s",
                 "latency_min", "latency_max", "busbws", "predicted", "pred_s", "pred_bus")

    def __init__(self, busbws: Exact | Binned) -> None:
        self.calls = self.bytes = self.unknown = self.timed = self.timed_bytes = 0
        # a bandwidth is bytes over the time of the calls whose bytes it sums: sized_s, the timed
        # calls of known size; bus_s, those whose busbw factor is known too
        self.time_s = self.bus_bytes = self.pred_s = self.pred_bus = self.sized_s = self.bus_s = 0.0
        self.latency_min: float | None = None
        self.latency_max: float | None = None
        self.busbws = busbws
        self.predicted = False

    def add(self, e: CollectiveEvent, predicted_s: float | None) -> None:
        self.calls += 1
        size, factor = e.size_bytes, e.busbw_factor
        if size is None:
            self.unknown += 1
        else:
            self.bytes += size
        if predicted_s is not None and size is not None:  # a prediction needs the size
            self.predicted = True
            self.pred_s += predicted_s
            self.pred_bus += size * (factor if factor is not None else 1.0)
        latency = e.latency_s
        if latency is None:
            return
        self.timed += 1
        self.time_s += latency
        if size is not None:
            self.timed_bytes += size
            self.sized_s += latency
            if factor is not None:
                self.bus_bytes += size * factor
                self.bus_s += latency
        if self.latency_min is None or latency < self.latency_min:
            self.latency_min = latency
        if self.latency_max is None or latency > self.latency_max:
            self.latency_max = latency
        busbw = e.busbw_gbps
        if busbw is not None:
            self.busbws.add(busbw)

    def add_totals(self, calls: int, nbytes: int | None, timed: int = 0, time_s: float = 0.0, timed_bytes: int = 0,
                   bus_bytes: float = 0.0, latency_min: float | None = None, latency_max: float | None = None) -> None:
        """Calls known only by their totals (older steps of a ``keep_steps`` run): no
        percentiles; ``nbytes`` None: their size is not known."""
        self.calls += calls
        if nbytes is None:
            self.unknown += calls
        else:
            self.bytes += nbytes
        if not timed:
            return
        self.timed += timed
        self.time_s += time_s
        if nbytes is not None:
            self.timed_bytes += timed_bytes
            self.bus_bytes += bus_bytes
            self.sized_s += time_s
            self.bus_s += time_s
        if latency_min is not None and (self.latency_min is None or latency_min < self.latency_min):
            self.latency_min = latency_min
        if latency_max is not None and (self.latency_max is None or latency_max > self.latency_max):
            self.latency_max = latency_max

    def row(self, key: dict[str, Any]) -> SummaryRow:
        row = SummaryRow(key, calls=self.calls, bytes=known_bytes(self.bytes, self.unknown, self.calls), timed_calls=self.timed,
                         unknown_size_calls=self.unknown)
        if self.timed:
            t = self.time_s
            row.time_s, row.avg_time_s = t, t / self.timed
            row.latency_min_s, row.latency_max_s = self.latency_min, self.latency_max
            if self.sized_s > 0:
                row.algbw_gbps = self.timed_bytes / self.sized_s / 1e9
            if self.bus_s > 0:
                row.busbw_gbps = self.bus_bytes / self.bus_s / 1e9
            row.busbw_p50_gbps, row.busbw_p90_gbps, row.busbw_p99_gbps = self.busbws.percentiles()
        if self.predicted:
            row.predicted_s = self.pred_s
            row.predicted_busbw_gbps = self.pred_bus / self.pred_s / 1e9 if self.pred_s > 0 else None
        return row


def rank_spread(values: Iterable[tuple[float, int]]) -> dict[str, Any] | None:
    """min / median / max of (value, rank) pairs, with the ranks holding the min and the max (the
    lowest rank on ties); None when there are none.

    >>> rank_spread([(3.0, 0), (5.0, 1), (4.0, 2)])
    {'min': 3.0, 'min_rank': 0, 'median': 4.0, 'max': 5.0, 'max_rank': 1}
    """
    pairs = list(values)
    if not pairs:
        return None
    lo, hi = min(pairs), max(pairs, key=lambda v: (v[0], -v[1]))
    return {"min": lo[0], "min_rank": lo[1], "median": statistics.median(v for v, _ in pairs), "max": hi[0], "max_rank": hi[1]}


@dataclass
class RankSpread:
    """How one row of a job varies across its ranks: :func:`rank_spread` of the row's calls over
    every rank (0 on a rank that made none) and of its time over the ranks that timed calls of it."""

    calls: dict[str, Any]
    time_s: dict[str, Any] | None = None

    @property
    def slowest_rank(self) -> int | None:
        """The rank that spent the most time in the row (the lowest such rank on ties)."""
        return None if self.time_s is None else self.time_s["max_rank"]

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "time_s": self.time_s, "slowest_rank": self.slowest_rank}


@dataclass
class SummaryRow:
    """One row: the grouping values, then counts, bytes, and (when timed) times and bandwidths;
    over a job's ranks, also how the row varies across them."""

    key: dict[str, Any]
    calls: int = 0
    bytes: int | None = 0  # the known sizes' sum; None when no call's size is known
    timed_calls: int = 0
    time_s: float | None = None
    avg_time_s: float | None = None
    latency_min_s: float | None = None
    latency_max_s: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    busbw_p50_gbps: float | None = None
    busbw_p90_gbps: float | None = None
    busbw_p99_gbps: float | None = None
    # predicted on a target cluster (commdebug.estimate), never mixed with the measured ones
    predicted_s: float | None = None
    predicted_busbw_gbps: float | None = None
    # calls whose size is not known (a trace recorded without shapes): left out of bytes and bandwidths
    unknown_size_calls: int = 0
    per_rank: RankSpread | None = None

    def to_dict(self, predicted: bool = True) -> dict[str, Any]:
        """Grouping keys then figures; the predicted keys only when ``predicted``, ``per_rank``
        only over a job's ranks."""
        out = dict(self.key)
        out.update({f.name: getattr(self, f.name) for f in fields(self)
                    if f.name not in ("key", "per_rank") and (predicted or f.name not in _PREDICTED)})
        if self.per_rank is not None:
            out["per_rank"] = self.per_rank.to_dict()
        return out


_PREDICTED = frozenset({"predicted_s", "predicted_busbw_gbps"})


@dataclass
class Summary:
    """Rows plus the run's header: elapsed time, communication time and its share. Over a job's
    ranks the header has ``ranks`` (the rank numbers) and ``hostnames``, and each row a ``per_rank``."""

    by: str
    rows: list[SummaryRow]
    header: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form; keys are documented in docs/summary.md and kept stable."""
        predicted = "cluster" in self.header
        return {"by": self.by, "header": self.header, "rows": [r.to_dict(predicted) for r in self.rows]}


def _keyed(trace: Trace, key_of: Callable[[CollectiveEvent], tuple], cluster: Any,
           ranks_per_node: int | None) -> tuple[Any, Iterator[tuple[tuple, CollectiveEvent, float | None]]]:
    """The prediction of ``trace`` on ``cluster`` (None without one), and each event with its row's
    key and predicted seconds."""
    from commdebug.estimate import predict_trace

    prediction = predict_trace(trace, cluster, ranks_per_node=ranks_per_node)
    seconds = prediction.seconds if prediction is not None else itertools.repeat(None)
    # strict=False: without a prediction, `seconds` repeats None without end
    return prediction, ((key_of(e), e, s) for e, s in zip(trace.events, seconds, strict=False))


def _older_rows(trace: Trace, by: str) -> Iterator[tuple[tuple, list]]:
    """(row key, totals) of the calls a trace keeps as totals only (``keep_steps``): per step
    [calls, bytes, timed, seconds], else [calls, bytes, timed, seconds, timed bytes, bus bytes, min, max]
    (bytes None where their size is not known)."""
    older = older_of(trace)
    if older is None:
        return
    if by == "step":
        for step, totals in older.steps.items():
            yield (step,), totals
        return
    for (module, phase, _key, op, group, size), totals in older.rows.items():
        if size is None:
            totals = [totals[0], None, *totals[2:]]
        yield {"op": (op,), "op,size": (op, size), "op,bin": (op, size_bin(size)), "module": (module,),
               "group": (trace.group(group).label,), "phase": (phase,)}[by], totals


def summarize(trace: Trace, by: str = "op", cluster: Any = None, ranks_per_node: int | None = None) -> Summary:
    """Summarise a trace's collective events grouped ``by`` one of :data:`BY`.

    ``cluster`` (a preset name, cluster file, dict or :class:`~commdebug.estimate.Cluster`;
    default: the dump's ``metadata.cluster``, if any) adds the predicted time and busbw of each
    row on that cluster (docs/estimate.md).

    >>> print(render_summary(summarize(comm.trace, "op,size")))   # doctest: +SKIP
    """
    by = parse_by(by)
    columns, key_of = BY[by]
    prediction, calls = _keyed(trace, key_of, cluster, ranks_per_node)
    tallies: dict[tuple, _Tally] = {}
    for key, event, seconds in calls:
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = _Tally(Exact())
        tally.add(event, seconds)
    for key, totals in _older_rows(trace, by):
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = _Tally(Exact())
        tally.add_totals(*totals)
    rows = sorted((t.row(dict(zip(columns, key, strict=True))) for key, t in tallies.items()), key=_order(by))
    header = _header(trace)
    if prediction is not None:
        header.update(cluster=prediction.cluster.name, predicted_s=prediction.total_s, prediction_notes=prediction.notes)
    return Summary(by, rows, header)


def summarize_ranks(traces: Iterable[Trace], by: str = "op", cluster: Any = None,
                    ranks_per_node: int | None = None) -> Summary:
    """One summary over the traces of a job's ranks, taken one at a time (one trace in memory,
    whatever the number of ranks). Rows add up every rank's calls; each row's ``per_rank`` says how
    it varies across ranks. A trace's rank is its ``metadata.rank``, else its place in ``traces``.
    Percentiles come from bins 0.27% wide (see :class:`Binned`), not from every call.

    >>> s = summarize_ranks(commdebug.load(f) for f in job_files("traces/"))   # doctest: +SKIP
    >>> s.rows[0].per_rank.slowest_rank                                            # doctest: +SKIP
    3
    """
    by = parse_by(by)
    columns, key_of = BY[by]
    tallies: dict[tuple, _Tally] = {}
    per_rank: dict[tuple, dict[int, list]] = {}  # key -> rank -> [calls, time or None]
    ranks: list[int] = []
    headers: list[dict[str, Any]] = []
    for index, trace in enumerate(traces):
        rank = trace.metadata.get("rank")
        rank = index if rank is None else int(rank)
        prediction, calls = _keyed(trace, key_of, cluster, ranks_per_node)
        for key, event, seconds in calls:
            tally = tallies.get(key)
            if tally is None:
                tally = tallies[key] = _Tally(Binned())
            tally.add(event, seconds)
            mine = per_rank.setdefault(key, {}).setdefault(rank, [0, None])
            mine[0] += 1
            if event.latency_s is not None:
                mine[1] = (mine[1] or 0.0) + event.latency_s
        for key, totals in _older_rows(trace, by):
            tally = tallies.get(key)
            if tally is None:
                tally = tallies[key] = _Tally(Binned())
            tally.add_totals(*totals)
            mine = per_rank.setdefault(key, {}).setdefault(rank, [0, None])
            mine[0] += totals[0]
            if totals[2]:
                mine[1] = (mine[1] or 0.0) + totals[3]
        header = _header(trace)
        if prediction is not None:
            header.update(cluster=prediction.cluster.name, predicted_s=prediction.total_s, prediction_notes=prediction.notes)
        ranks.append(rank)
        headers.append(header)
    rows = []
    for key, tally in tallies.items():
        row = tally.row(dict(zip(columns, key, strict=True)))
        seen = per_rank[key]
        spread = rank_spread((seen[r][0] if r in seen else 0, r) for r in ranks)
        assert spread is not None  # the row's calls came from a rank of `ranks`
        row.per_rank = RankSpread(spread, rank_spread((t, r) for r, (_, t) in seen.items() if t is not None))
        rows.append(row)
    rows.sort(key=_order(by))
    return Summary(by, rows, _job_header(headers, ranks))


def summarize_path(path: Dumps, by: str = "op", cluster: Any = None,
                   ranks_per_node: int | None = None, rank: int | None = None,
                   progress: Callable[[int, int], None] | None = None, jobs: int | None = 1) -> Summary:
    """:func:`summarize` of one dump, or :func:`summarize_ranks` of a folder of rank dumps (one
    run's: a folder mixing runs is refused; a folder of per-node folders, or several folders,
    are one job), each read when its turn comes; with ``rank``, the one file of that rank in
    the folder (its dump, or its stream while it runs or after a kill).
    ``progress(done, total)`` is told after each rank of a folder is read.

    >>> print(render_summary(summarize_path("traces/", "op")))   # doctest: +SKIP
    """
    from commdebug.formats.folders import dumps_name, find_job, one_file, rank_from_name
    from commdebug.formats.readers import read, read_all

    def load(f: Path, data: object = None) -> Trace:  # data: read_all's result for f
        if isinstance(data, DumpError):
            raise data
        trace = read(f) if data is None else data
        if not isinstance(trace, Trace):  # a RankView: no module tree, phases or steps to group by
            raise DumpError(f"{f}: a PyTorch Flight Recorder dump; summary reads commdebug's dumps (`commdebug check` reads both)")
        return trace

    by = parse_by(by)  # a bad grouping fails before any file is read
    single = one_file(path)
    if single is not None:
        if rank is not None:
            raise CommDebugError(f"{single}: --rank picks one rank out of a folder; this is one dump already")
        return summarize(load(single), by, cluster, ranks_per_node)
    job = find_job(path)
    if rank is not None:
        files = {rank_from_name(f): f for f in job.files}
        if rank not in files:
            raise DumpError(f"{dumps_name(path)}: no dump or stream of rank {rank} (ranks here: {_rank_list(sorted(files))})")
        trace = load(files[rank])
        if trace.metadata.get("rank") is None:
            trace.metadata["rank"] = rank
        return summarize(trace, by, cluster, ranks_per_node)

    placements: dict[int, Placement] = {}

    def traces() -> Iterator[Trace]:
        files = job.files
        for done, (f, data) in enumerate(read_all(files, "read", jobs=jobs), 1):  # jobs: processes reading
            trace = load(f, data)
            if trace.metadata.get("rank") is None:  # torch's own dumps say no rank; the file name does
                trace.metadata["rank"] = rank_from_name(f)
            placements[int(trace.metadata["rank"])] = placement_of(trace.metadata)
            if progress is not None:
                progress(done, len(files))
            yield trace

    summary = summarize_ranks(traces(), by, cluster, ranks_per_node)
    away = absence(int(summary.header.get("world_size") or 0), placements, job.scope)
    said = away.note()
    if said is not None:  # a node's folder: the header's "ranks 2-3 of 4" and where the others may be
        summary.header["ranks_absent"] = list(away.elsewhere)
        summary.header["read_notes"] = [said, *summary.header.get("read_notes", [])]
    return summary


def _rank_list(ranks: list[int]) -> str:
    from commdebug.analysis.check import who

    return who(ranks).split(" ", 1)[-1]


def _order(by: str) -> Callable[[SummaryRow], Any]:
    if by in ("op,size", "op,bin", "step"):  # by op, then size (a size not known last); steps in order
        columns = BY[by][0]
        return lambda r: tuple((r.key[c] is None, r.key[c] or 0) for c in columns)
    # heaviest first: time when timed, else bytes, then calls
    return lambda r: (-(r.time_s or 0.0), -(r.bytes or 0), -r.calls, str(list(r.key.values())))


def _header(trace: Trace) -> dict[str, Any]:
    meta = trace.metadata
    timed = [e.latency_s for e in trace.events if e.latency_s is not None]
    older = older_of(trace)
    sizes = list(map(SIZE, trace.events))
    count = len(trace.events) + (older.events if older is not None else 0)
    unknown = sizes.count(None) + (sum(r[0] for k, r in older.rows.items() if k[5] is None) if older is not None else 0)
    older_timed = sum(r[2] for r in older.rows.values()) if older is not None else 0
    older_s = (older.time_s or 0.0) if older is not None else 0.0
    comm_s = sum(timed) + older_s if timed or older_timed else None
    recorded = meta.get("recorded_s", meta.get("elapsed_s"))
    base = share_base(trace.events, meta, trace.profile, older.steps if older is not None else None)
    header: dict[str, Any] = {
        "rank": meta.get("rank"),
        "world_size": meta.get("world_size"),
        "hostname": meta.get("hostname"),
        "timing": meta.get("timing", "off" if not timed else "sync"),
        "steps": _steps(trace),
        "collectives": count,
        "bytes": known_bytes(sum(s for s in sizes if s is not None) + (older.bytes if older is not None else 0), unknown, count),
        "unknown_size_calls": unknown,
        "timed_collectives": len(timed) + older_timed,
        "elapsed_s": meta.get("elapsed_s"),
        "recorded_s": recorded,
        "comm_time_s": comm_s,
        # over the time of the steps its calls were timed in (all of them, or a profile's)
        "share_time_s": base.seconds,
        "comm_share": comm_s / base.seconds if comm_s is not None and base.seconds else None,
        "events_dropped": max(trace.events_dropped - (older.events if older is not None else 0), 0),
        "timing_notes": list(meta.get("timing_notes") or []),
    }
    if comm_s is not None and base.partial:  # only some steps timed: the share says over which
        header["timed_steps"] = [base.timed_steps, base.steps]
    if older is not None and older.events:  # keep_steps: these calls count in the rows, as totals
        header["totals_only"] = older.events
    if meta.get("read_notes"):
        header["read_notes"] = list(meta["read_notes"])
    if meta.get("capture") == "light":  # a full capture's header stays as it was
        every, steps = meta.get("detail_every"), meta.get("detail_steps")
        header.update(capture="light", detail_every=every if isinstance(every, int) else None,
                      detail_steps=sorted(s for s in steps if isinstance(s, int)) if isinstance(steps, list) else [])
    return header


def _steps(trace: Trace) -> int:
    """How many steps the trace covers: a torch.profiler trace's ``ProfilerStep`` numbers need
    not start at 0 (steps 4-6 are 3 steps, not 7)."""
    span = trace.metadata.get("profile_steps")
    if trace.metadata.get("format") == "torch-profiler" and isinstance(span, list) and len(span) == 2:
        return int(span[1]) - int(span[0]) + 1
    return trace.steps


def _job_header(headers: list[dict[str, Any]], ranks: list[int]) -> dict[str, Any]:
    """The ranks' headers as one: counts and times summed, elapsed and steps the longest rank's,
    the communication share that of all ranks' time together, each note once with its ranks."""
    from commdebug.analysis.check import who

    def known(name: str) -> list[Any]:
        return [h[name] for h in headers if h.get(name) is not None]

    def total(name: str) -> Any:
        values = known(name)
        return sum(values) if values else None

    def longest(name: str) -> Any:
        values = known(name)
        return max(values) if values else None

    def notes(name: str) -> list[str]:
        holders: dict[str, list[int]] = {}
        for rank, h in zip(ranks, headers, strict=True):
            for note in h.get(name) or []:
                holders.setdefault(note, []).append(rank)
        # a note several ranks wrote alike holds each one's own figures ("21 collectives")
        return [f"{who(rs)}{', each' if len(set(rs)) > 1 else ''}: {note}" for note, rs in holders.items()]

    shares = [(h["comm_time_s"], h["share_time_s"]) for h in headers if h["comm_time_s"] is not None and h["share_time_s"]]
    job: dict[str, Any] = {
        "ranks": ranks,
        "world_size": longest("world_size"),
        "hostnames": sorted(set(known("hostname"))),
        "timing": ", ".join(sorted(set(known("timing")))),
        "steps": longest("steps") or 0,
        "collectives": total("collectives") or 0,
        "bytes": total("bytes") or 0,
        "timed_collectives": total("timed_collectives") or 0,
        "elapsed_s": longest("elapsed_s"),
        "recorded_s": longest("recorded_s"),
        "comm_time_s": total("comm_time_s"),
        "share_time_s": sum(r for _, r in shares) if shares else None,
        "comm_share": sum(c for c, _ in shares) / sum(r for _, r in shares) if shares else None,
        "events_dropped": total("events_dropped") or 0,
        "timing_notes": notes("timing_notes"),
    }
    timed_steps = [h["timed_steps"] for h in headers if h.get("timed_steps")]
    if timed_steps:  # the ranks timed only some steps: the fewest timed of the most
        job["timed_steps"] = [min(t for t, _ in timed_steps), max(n for _, n in timed_steps)]
    if total("totals_only"):
        job["totals_only"] = total("totals_only")
    if any(h.get("read_notes") for h in headers):
        job["read_notes"] = notes("read_notes")
    light = [h for h in headers if h.get("capture") == "light"]
    if light:
        # ranks of one launch share detail_every; their detail steps differ only where a rank
        # stopped early, so the union says which steps have detail on some rank
        everies = {h["detail_every"] for h in light}
        job.update(capture="light", detail_every=everies.pop() if len(everies) == 1 else None,
                   detail_steps=sorted({s for h in light for s in h["detail_steps"]}))
    if known("cluster"):
        job.update(cluster=known("cluster")[0], predicted_s=total("predicted_s"), prediction_notes=notes("prediction_notes"))
    return job
