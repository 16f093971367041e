"""``commdebug report`` as text: per-rank table with min / median / max rows, then per op."""

from __future__ import annotations

from typing import Any, Callable

from commdebug.analysis.report import Report
from commdebug.render.columns import align
from commdebug.units import format_bytes, format_gbps, format_s, format_share

__all__ = ["render_report"]


_RANK_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("collectives", "collectives", lambda v: f"{v:g}"),
    ("bytes", "bytes", format_bytes),
    ("comm_time_s", "comm s", format_s),
    ("elapsed_s", "elapsed s", format_s),
    ("share", "share", format_share),
    ("straggler_s", "straggler s", format_s),
]


def render_report(rep: Report) -> str:
    """The report as text, ending with a newline."""
    lines = [f"commdebug report: {len(rep.ranks)} rank{'s' if len(rep.ranks) != 1 else ''}"
             + ("" if rep.timed else "; no timing was recorded (record with --timing): counts and bytes only"), ""]
    rows = [["rank", "host"] + [title for _, title, _ in _RANK_COLUMNS]]
    for r in rep.ranks:
        rows.append([str(r.rank), r.host or "?"] + [fmt(getattr(r, attr) if attr != "share" else r.share) for attr, _, fmt in _RANK_COLUMNS])
    spread = {attr: rep.spread(attr) for attr, _, _ in _RANK_COLUMNS}
    for which in ("min", "median", "max"):
        row = [which, ""]
        for attr, _, fmt in _RANK_COLUMNS:
            s = spread[attr]
            if s is None:
                row.append("-")
            else:
                holder = f" (r{s[which + '_rank']})" if which != "median" else ""
                row.append(fmt(s[which]) + holder)
        rows.append(row)
    lines += align(rows, left=2)
    lines.append("")
    rows = [["op", "calls", "bytes", "timed", "time s", "algbw GB/s", "busbw GB/s", "straggler s"]]
    for o in rep.ops:
        rows.append([o.op, str(o.calls), format_bytes(o.bytes), str(o.timed), format_s(o.time_s if o.timed else None),
                     format_gbps(o.algbw_gbps), format_gbps(o.busbw_gbps), format_s(o.straggler_s if o.timed else None)])
    lines += align(rows)
    if rep.timed:
        lines += ["", "straggler s: time spent in calls beyond the fastest rank's time for the same call (group, sequence number);",
                  "a rank with little of it arrived last and made the others wait."]
    lines.extend(f"note: {n}" for n in rep.notes)
    return "\n".join(lines) + "\n"
