"""Predicted times laid out the way the reports show collectives: per line of the tracing table
(module, phase, op key, group), per module and phase, and per event; and, for a timed job,
measured beside predicted per op and size bin, module and step (:func:`compare_measured`).

The numbers come from :func:`commdebug.estimate.predict_trace` (docs/estimate.md); this module
only adds them up along the module tree, the way the trace counts collectives: a call counts for
its module and every ancestor. Renderers (the table, the viewer) format what it returns.

>>> p = trace_predictions(commdebug.load("plan.json"), "h100-ib400")   # doctest: +SKIP
>>> p.line("Global", "forward", "c10d_functional.all_reduce", "0")     # doctest: +SKIP
LinePrediction(seconds=4.3e-05, calls=4)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.estimate.alpha_beta import Prediction, predict_events, predict_trace, resolve_cluster
from commdebug.estimate.calibrate import is_nccl_tests_file
from commdebug.estimate.cluster import Cluster, ClusterError
from commdebug.estimate.presets import PRESETS
from commdebug.estimate.timed import TimedJob, timed_calls
from commdebug.formats.folders import Dumps, dumps_name, find_job, one_file
from commdebug.formats.readers import iter_ranks
from commdebug.formats.selection import read_views
from commdebug.model.presence import Placement, absence, placement_of
from commdebug.model.rank_view import RankView
from commdebug.model.trace import GLOBAL, Trace

__all__ = ["LinePrediction", "TracePredictions", "trace_predictions", "CompareRow", "Comparison", "compare_measured",
           "compare_path", "calibration_inputs", "COMPARE_BY"]


@dataclass(frozen=True)
class LinePrediction:
    """Predicted seconds of the calls of one table line, and how many calls that covers (fewer
    than the line's count when older events were dropped or a group's size is unknown)."""

    seconds: float
    calls: int


@dataclass
class TracePredictions:
    """A trace's predictions on one cluster: per event (``seconds[i]`` is ``trace.events[i]``'s
    predicted seconds, None when it cannot be predicted), per table line and per module/phase."""

    prediction: Prediction
    # (fqn, phase, op key, group name) -> prediction; descendants included, like the counts
    lines: dict[tuple[str, str, str, str], LinePrediction] = field(default_factory=dict)

    @property
    def cluster(self) -> Cluster:
        return self.prediction.cluster

    @property
    def seconds(self) -> list[float | None]:
        return self.prediction.seconds

    @property
    def notes(self) -> list[str]:
        return self.prediction.notes

    @property
    def total_s(self) -> float:
        """All predicted seconds, added up as if the calls ran one after another."""
        return self.prediction.total_s

    def line(self, fqn: str, phase: str, key: str, group: str) -> LinePrediction | None:
        """The prediction of one table line (module, phase, op key such as
        ``c10d_functional.all_reduce``, group name), None when none of its calls was predicted."""
        return self.lines.get((fqn, phase, key, group))

    def by_module_phase(self) -> dict[str, dict[str, float]]:
        """fqn -> phase -> predicted seconds, descendants included; modules and phases with no
        predicted call are left out."""
        out: dict[str, dict[str, float]] = {}
        for (fqn, phase, _, _), line in self.lines.items():
            phases = out.setdefault(fqn, {})
            phases[phase] = phases.get(phase, 0.0) + line.seconds
        return out


def trace_predictions(trace: Trace, cluster: Any = None, *, ranks_per_node: int | None = None) -> TracePredictions | None:
    """Predictions of ``trace``'s kept events on ``cluster`` (a preset name, cluster file, dict
    or :class:`~commdebug.estimate.Cluster`; default: the trace's ``metadata.cluster``), added
    up per table line; None when there is no cluster. Reads the trace only: call it when
    rendering, never while recording."""
    prediction = predict_trace(trace, cluster, ranks_per_node=ranks_per_node)
    if prediction is None:
        return None
    sums: dict[tuple[str, str, str, str], list] = {}
    chains: dict[str, tuple[str, ...]] = {}
    for event, seconds in zip(trace.events, prediction.seconds, strict=True):
        if seconds is None:
            continue
        chain = chains.get(event.module)
        if chain is None:
            chain = chains[event.module] = _ancestry(trace, event.module)
        for fqn in chain:
            acc = sums.setdefault((fqn, event.phase, event.key, event.group.name), [0.0, 0])
            acc[0] += seconds
            acc[1] += 1
    lines = {k: LinePrediction(s, n) for k, (s, n) in sums.items()}
    return TracePredictions(prediction, lines)


def _ancestry(trace: Trace, fqn: str) -> tuple[str, ...]:
    """The module and its ancestors in the tree, Global last; Global alone for a module the tree
    does not know (as the viewer places such calls)."""
    out: list[str] = []
    current: str | None = fqn if fqn in trace.modules else GLOBAL
    while current is not None:
        out.append(current)
        current = trace.modules[current].parent
    return tuple(out)


# ---- measured beside predicted: a timed job ------------------------------------------------

COMPARE_BY = ("op,bin", "module", "step")


@dataclass
class CompareRow:
    """Calls of one group (``key``: the grouping values), their measured seconds (each call's
    shortest latency over the ranks) and predicted seconds, added up."""

    key: dict[str, Any]
    calls: int = 0
    bytes: int = 0
    measured_s: float = 0.0
    predicted_s: float = 0.0

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when nothing was measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.key, "calls": self.calls, "bytes": self.bytes, "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "error": self.error}


@dataclass
class Comparison:
    """A timed job's calls measured and predicted on one cluster: a table per grouping (``by``
    name -> rows), the total, and how the predictions were made (``sources``: kind -> calls)."""

    cluster: Cluster
    tables: dict[str, list[CompareRow]]
    total: CompareRow
    ranks: int
    untimed: int
    unpredicted: int
    sources: dict[str, int]
    notes: list[str]


def compare_measured(job: TimedJob, cluster: Any = None, *, by: Iterable[str] = COMPARE_BY,
                     ranks_per_node: int | None = None) -> Comparison | None:
    """Each timed call of ``job`` (:func:`commdebug.estimate.timed.timed_calls`) beside its
    prediction on ``cluster`` (default: the job's ``metadata.cluster``), added up per grouping
    of :data:`commdebug.analysis.summary.BY` (default: op and size bin, module, step) and in
    total; None when there is no cluster. Calls that cannot be predicted are counted apart.

    >>> c = compare_measured(timed_calls(iter_ranks("traces/")), "my_cluster.json")   # doctest: +SKIP
    >>> c.total.error                                                                  # doctest: +SKIP
    -0.031
    """
    from commdebug.analysis.summary import BY, parse_by

    resolved = resolve_cluster(cluster, job.metadata)
    if resolved is None:
        return None
    groupings = [parse_by(b) for b in by]
    by_rank: dict[int, list[int]] = {}
    for i, call in enumerate(job.calls):
        by_rank.setdefault(call.rank, []).append(i)
    seconds: list[float | None] = [None] * len(job.calls)
    sources: dict[str, int] = {}
    notes: set[str] = set()
    for rank, indices in by_rank.items():
        pred = predict_events([job.calls[i].event for i in indices], resolved, rank=rank, ranks_per_node=ranks_per_node)
        notes.update(pred.notes)
        for i, s, where in zip(indices, pred.seconds, pred.sources, strict=True):
            seconds[i] = s
            if where is not None:
                sources[where.kind] = sources.get(where.kind, 0) + 1
    tables: dict[str, dict[tuple, CompareRow]] = {b: {} for b in groupings}
    total = CompareRow({})
    unpredicted = 0
    for call, s in zip(job.calls, seconds, strict=True):
        if s is None:
            unpredicted += 1
            continue
        e = call.event
        for row in [total] + [_row(tables[b], BY[b], e) for b in groupings]:
            row.calls += 1
            row.bytes += e.size_bytes or 0  # predicted calls have a known size (alpha_beta skips the others)
            row.measured_s += call.seconds
            row.predicted_s += s
    ordered = {b: sorted(rows.values(), key=_compare_order(b)) for b, rows in tables.items()}
    return Comparison(resolved, ordered, total, job.ranks, job.untimed, unpredicted, sources, sorted(notes))


def timed_job(path: Dumps) -> TimedJob:
    """The timed calls of a dump or folder of ranks (a folder of per-node folders, or several
    folders), ours or Flight Recorder's."""
    return _timed_job(path)[0]


def _timed_job(path: Dumps) -> tuple[TimedJob, str | None]:
    """:func:`timed_job`, and for a node's folder read alone the note that says so: each call's
    measured time is its least over the ranks present (:mod:`commdebug.model.presence`)."""
    if one_file(path) is not None:
        return timed_calls(iter_ranks(path), source=dumps_name(path)), None
    job = find_job(path)
    placements: dict[int, Placement] = {}
    world = 0

    def views() -> Iterator[RankView]:
        nonlocal world
        for view in read_views(job.files):
            placements[view.rank] = placement_of(view.metadata)
            world = max(world, int(view.metadata.get("world_size") or 0))
            yield view

    timed = timed_calls(views(), source=dumps_name(path))
    said = absence(world, placements, job.scope).note()
    if said is None:
        return timed, None
    return timed, (f"{said}; each call's measured time is its least over the ranks present, more than over every "
                   "member where an absent one waited least")


def compare_path(path: Dumps, cluster: Any = None, *, by: Iterable[str] = COMPARE_BY,
                 ranks_per_node: int | None = None) -> Comparison | None:
    """:func:`compare_measured` on a dump or folder of ranks; None when none of its calls was
    timed. A cluster is needed then: the argument, else the dump's own, else an error."""
    job, partial = _timed_job(path)
    if not job.calls:
        return None
    comparison = compare_measured(job, cluster, by=by, ranks_per_node=ranks_per_node)
    if comparison is not None and partial is not None:
        comparison.notes.insert(0, partial)
    if comparison is None:
        raise ClusterError(f"{dumps_name(path)}: no cluster to predict on: give --cluster NAME|FILE (presets: {', '.join(PRESETS)})")
    return comparison


def calibration_inputs(paths: Iterable[str | os.PathLike]) -> list[Path | TimedJob]:
    """What :func:`commdebug.estimate.calibrate.calibrate` takes for each path: nccl-tests text
    as its path, a timed dump or folder of ranks as its :class:`TimedJob`."""
    return [Path(p) if is_nccl_tests_file(Path(p)) else timed_job(p) for p in paths]


def _row(rows: dict[tuple, CompareRow], grouping: tuple, e: Any) -> CompareRow:
    columns, key_of = grouping
    key = key_of(e)
    row = rows.get(key)
    if row is None:
        row = rows[key] = CompareRow(dict(zip(columns, key, strict=True)))
    return row


def _compare_order(by: str) -> Any:
    if by in ("op,size", "op,bin", "step"):
        return lambda r: tuple(r.key.values())
    return lambda r: (-r.measured_s, str(list(r.key.values())))
