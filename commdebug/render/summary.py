"""The summary as text: a header like mpitrace's (elapsed, communication time and share), then
one aligned row per group. Sizes in KiB/MiB (base 1024), bandwidths in GB/s (1e9 bytes/s)."""

from __future__ import annotations

from typing import Any, Callable

from commdebug.analysis.summary import Summary
from commdebug.units import format_bytes, format_gbps, format_ms, format_s

__all__ = ["render_summary"]


def _seconds(value: float | None) -> str:
    return f"{format_s(value)} s" if value is not None else "-"


_KEY_CELLS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "op": ("op", str),
    "size_bytes": ("size", format_bytes),
    "size_bin": ("size bin", str),
    "module": ("module", str),
    "group": ("group", str),
    "step": ("step", str),
    "phase": ("phase", str),
}


def render_summary(summary: Summary) -> str:
    """The summary table as text, ending with a newline.

    >>> print(render_summary(summarize(trace, "op")))   # doctest: +SKIP
    """
    h = summary.header
    lines = [f"commdebug summary by {summary.by}: rank {h.get('rank', '?')} of {h.get('world_size', '?')}"
             f" on {h.get('hostname') or '?'}, {h.get('steps', 0)} step{'s' if h.get('steps') != 1 else ''},"
             f" {h['collectives']} collectives, {format_bytes(h['bytes'])}"]
    timed = h["timed_collectives"] > 0
    if timed:
        share = "" if h["comm_share"] is None else f" ({h['comm_share'] * 100:.1f}% of recorded time)"
        lines.append(f"elapsed {_seconds(h['elapsed_s'])}, recorded {_seconds(h['recorded_s'])},"
                     f" communication {_seconds(h['comm_time_s'])}{share}, timing {h['timing']}"
                     + ("" if h["timed_collectives"] == h["collectives"] else f" ({h['timed_collectives']} of {h['collectives']} calls timed)"))
    else:
        lines.append(f"elapsed {_seconds(h['elapsed_s'])}; no timing was recorded (timing {h['timing']}): counts and bytes only")
    predicted = h.get("cluster") is not None
    if predicted:
        lines.append(f"predicted on cluster {h['cluster']}: {format_ms(h['predicted_s'])} ms of communication"
                     " (a model, not a measurement: docs/estimate.md); 'pred' columns are predicted")
        for note in h.get("prediction_notes") or []:
            lines.append(f"note: {note}")
    for note in h.get("timing_notes") or []:
        lines.append(f"note: {note}")
    if h.get("events_dropped"):
        lines.append(f"note: {h['events_dropped']} older calls were dropped (max_events); rows cover the calls kept")
    lines.append("")

    key_cols = list(summary.rows[0].key) if summary.rows else []
    headers = [_KEY_CELLS[k][0] for k in key_cols] + ["calls", "bytes"]
    if predicted:
        headers += ["pred ms", "pred busbw GB/s"]
    if timed:
        headers += ["time ms", "avg ms", "algbw GB/s", "busbw GB/s", "busbw p50", "p90", "p99"]
    table = [headers]
    for r in summary.rows:
        cells = [_KEY_CELLS[k][1](r.key[k]) for k in key_cols] + [str(r.calls), format_bytes(r.bytes)]
        if predicted:
            cells += [format_ms(r.predicted_s), format_gbps(r.predicted_busbw_gbps)]
        if timed:
            cells += [format_ms(r.time_s), format_ms(r.avg_time_s), format_gbps(r.algbw_gbps), format_gbps(r.busbw_gbps),
                      format_gbps(r.busbw_p50_gbps), format_gbps(r.busbw_p90_gbps), format_gbps(r.busbw_p99_gbps)]
        table.append(cells)
    if not summary.rows:
        lines.append("no collectives recorded")
        return "\n".join(lines) + "\n"
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    n_keys = len(key_cols)
    for row in table:
        lines.append("  ".join(c.ljust(w) if i < n_keys else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines) + "\n"
