"""Predicted times laid out the way the reports show collectives: per line of the tracing table
(module, phase, op key, group), per module and phase, and per event.

The numbers come from :func:`commdebug.estimate.predict_trace` (docs/estimate.md); this module
only adds them up along the module tree, the way the trace counts collectives: a call counts for
its module and every ancestor. Renderers (the table, the viewer) format what it returns.

>>> p = trace_predictions(commdebug.load("plan.json"), "h100-ib400")   # doctest: +SKIP
>>> p.line("Global", "forward", "c10d_functional.all_reduce", "0")     # doctest: +SKIP
LinePrediction(seconds=4.3e-05, calls=4)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commdebug.estimate.alpha_beta import Prediction, predict_trace
from commdebug.estimate.cluster import Cluster
from commdebug.model.trace import GLOBAL, Trace

__all__ = ["LinePrediction", "TracePredictions", "trace_predictions"]


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
