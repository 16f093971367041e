"""``commdebug estimate`` as text and JSON: predicted time per group of calls, then per step.
Every figure here is a prediction on a cluster model (docs/estimate.md), never a measurement."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from commdebug.analysis.summary import Summary
from commdebug.estimate.cluster import Cluster
from commdebug.render.columns import align
from commdebug.render.summary import key_cells, key_dict, key_titles
from commdebug.units import format_bytes, format_duration, format_gbps

__all__ = ["render_estimate", "estimate_dict", "render_presets"]

_ROW_KEYS = ("calls", "bytes", "predicted_s", "predicted_busbw_gbps")


def _table(summary: Summary) -> list[str]:
    if not summary.rows:
        return ["no collectives recorded"]
    keys = list(summary.rows[0].key)
    table = [key_titles(keys) + ["calls", "bytes", "predicted time", "predicted busbw GB/s"]]
    for r in summary.rows:
        table.append(key_cells(r.key) + [str(r.calls), format_bytes(r.bytes), format_duration(r.predicted_s), format_gbps(r.predicted_busbw_gbps)])
    return align(table, left=len(keys))


def render_estimate(summary: Summary, steps: Summary) -> str:
    """The rows of ``summary`` and the per-step totals of ``steps``, both predicted."""
    h = summary.header
    lines = [f"commdebug estimate by {summary.by}: predicted on cluster {h['cluster']} (a model, not a measurement)",
             f"rank {h.get('rank', '?')} of {h.get('world_size', '?')}, {h.get('steps', 0)} step{'s' if h.get('steps') != 1 else ''}, {h['collectives']} collectives,"
             f" {format_bytes(h['bytes'])}; predicted communication {format_duration(h['predicted_s'])}"]
    lines += [f"note: {n}" for n in h.get("prediction_notes") or []]
    if h.get("events_dropped"):
        lines.append(f"note: {h['events_dropped']} older calls were dropped (max_events); rows cover the calls kept")
    lines.append("")
    lines += _table(summary)
    if summary.by != "step" and steps.rows:
        lines += ["", "per step:"]
        lines += ["  " + line for line in _table(steps)]
    return "\n".join(lines) + "\n"


def estimate_dict(summary: Summary, steps: Summary) -> dict[str, Any]:
    """The ``--json`` form: ``cluster``, ``by``, ``header``, ``rows`` (grouping keys plus
    calls, bytes, predicted_s, predicted_busbw_gbps), ``steps`` (step, predicted_s, ...)."""
    def rows(s: Summary) -> list[dict[str, Any]]:
        return [{**key_dict(r.key), **{k: getattr(r, k) for k in _ROW_KEYS}} for r in s.rows]

    return {"cluster": summary.header["cluster"], "by": summary.by, "header": summary.header,
            "rows": rows(summary), "steps": rows(steps)}


def render_presets(clusters: Iterable[Cluster]) -> str:
    """The presets' figures and where they come from."""
    lines = []
    for c in clusters:
        lines.append(f"{c.name}: {c.description}")
        lines.append(f"  gpus_per_node {c.gpus_per_node}; intra_node {c.intra_node.busbw_gbps:g} GB/s busbw, {c.intra_node.latency_us:g} us;"
                     f" network {c.network.busbw_gbps:g} GB/s busbw per GPU, {c.network.latency_us:g} us")
        lines.append(f"  model: {c.model}")
        lines += [f"  source: {s}" for s in c.sources]
    return "\n".join(lines) + "\n"
