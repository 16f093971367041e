"""``commdebug estimate`` on a timed job: measured beside predicted, as text and JSON.

The measured time of a call is its shortest latency over the ranks (commdebug/estimate/timed.py);
the predicted one comes from the cluster's model (docs/estimate.md). Error = (predicted -
measured) / measured, per row and in total.
"""

from __future__ import annotations

from typing import Any

from commdebug.analysis.predicted import CompareRow, Comparison
from commdebug.render.columns import align
from commdebug.render.summary import key_cells, key_dict, key_titles
from commdebug.units import format_bytes, format_duration

__all__ = ["render_comparison", "comparison_dict", "format_error"]

_TITLES = {"op,bin": "per op and size bin", "op,size": "per op and size", "op": "per op", "module": "per module",
           "step": "per step", "phase": "per phase", "group": "per group"}


def format_error(error: float | None) -> str:
    """A relative error as a signed percentage: ``format_error(-0.031) == "-3.1%"``."""
    return "-" if error is None else f"{error * 100:+.1f}%"


def _table(rows: list[CompareRow]) -> list[str]:
    if not rows:
        return ["no timed collectives"]
    keys = list(rows[0].key)
    table = [key_titles(keys) + ["calls", "bytes", "measured", "predicted", "error"]]
    for r in rows:
        table.append(key_cells(r.key) + [str(r.calls), format_bytes(r.bytes), format_duration(r.measured_s),
                                         format_duration(r.predicted_s), format_error(r.error)])
    return align(table, left=len(keys))


def render_comparison(c: Comparison) -> str:
    """Header, total, then one table per grouping."""
    measured = ("each call's shortest latency over the ranks (once the last member arrived)" if c.ranks > 1
                else "this rank's own latencies (a folder of ranks gives each call's shortest latency over them)")
    made = ", ".join(f"{n} {kind}" for kind, n in sorted(c.sources.items(), key=lambda kv: -kv[1]))
    t = c.total
    lines = [f"commdebug estimate: measured beside predicted on cluster {c.cluster.name}",
             f"model: {c.cluster.model}",
             f"{c.ranks} rank{'s' if c.ranks != 1 else ''}, {t.calls} timed calls, {format_bytes(t.bytes)}; measured: {measured}",
             f"predictions: {made or 'none'}",
             f"total: measured {format_duration(t.measured_s)}, predicted {format_duration(t.predicted_s)}, error {format_error(t.error)}"]
    if c.untimed:
        lines.append(f"note: {c.untimed} calls had no time (untimed, in flight or failed): left out")
    if c.unpredicted:
        lines.append(f"note: {c.unpredicted} timed calls could not be predicted: left out")
    lines += [f"note: {n}" for n in c.notes]
    for by, rows in c.tables.items():
        lines += ["", f"{_TITLES.get(by, 'by ' + by)}:"]
        lines += ["  " + line for line in _table(rows)]
    return "\n".join(lines) + "\n"


def comparison_dict(c: Comparison) -> dict[str, Any]:
    """The ``--json`` form: ``cluster``, ``model``, ``ranks``, ``untimed``, ``unpredicted``,
    ``sources`` (kind -> calls), ``total`` and ``tables`` (grouping -> rows of the grouping keys
    plus calls, bytes, measured_s, predicted_s, error)."""
    def row(r: CompareRow) -> dict[str, Any]:
        return {**key_dict(r.key), **{k: v for k, v in r.to_dict().items() if k not in r.key}}

    return {"cluster": c.cluster.name, "model": c.cluster.model, "ranks": c.ranks, "untimed": c.untimed,
            "unpredicted": c.unpredicted, "sources": c.sources, "notes": c.notes, "total": row(c.total),
            "tables": {by: [row(r) for r in rows] for by, rows in c.tables.items()}}
