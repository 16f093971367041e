"""``commdebug report`` as text: per-rank table with min / median / max rows, then per op.

A thousand ranks make a table nobody reads: from :data:`TOP_FROM` ranks on, the table lists only
the :data:`TOP_DEFAULT` ranks furthest from the median (``--top K`` chooses K; ``--top 0`` all),
each with the figure that sets it apart; the min / median / max rows still cover every rank.

Each rank row names its worst steps when the run was timed: the steps where its time most
exceeds the median rank's there, and by how much (``6 +1.04 s, 7 +882 ms``): a slow rank says
when it was slow. The per-op table sums every rank's calls, and its title says so.

A job with all_to_all calls gets an imbalance table: per step and group, its most uneven call's
received bytes, max over mean, and the rank that received most (the worst :data:`IMBALANCE_ROWS`
rows; ``--json`` has them all).

A timed job gets its late ranks (:mod:`commdebug.render.late`): per step, the ranks that arrived
last and made the others wait, worst first, each with the call and the gap before it; each
rank row's ``caused`` column is its total."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from commdebug.analysis.report import Deviation, OpStats, RankStats, Report
from commdebug.analysis.traffic import Imbalance
from commdebug.render.columns import align
from commdebug.render.late import late_lines
from commdebug.units import UNKNOWN, format_bytes, format_duration, format_gbps, format_known_bytes, format_share, who

__all__ = ["render_report", "shown_ranks", "TOP_FROM", "TOP_DEFAULT"]

TOP_FROM = 64  # from this many ranks on, the table lists the furthest ranks only
TOP_DEFAULT = 16
IMBALANCE_ROWS = 10  # the imbalance table's rows in text, worst first


def shown_ranks(ranks: int, top: int | None) -> int | None:
    """How many ranks the table lists for `ranks` ranks and ``--top`` `top` (None: not given):
    None for all of them."""
    if top is None:
        top = TOP_DEFAULT if ranks >= TOP_FROM else 0
    return top if 0 < top < ranks else None


_RANK_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("collectives", "collectives", lambda v: f"{v:g}"),
    ("bytes", "bytes", format_bytes),
    ("comm_time_s", "comm time", format_duration),
    ("elapsed_s", "elapsed", format_duration),
    ("share", "share", format_share),
    ("straggler_s", "straggler", format_duration),
    ("caused_wait_s", "caused", format_duration),
]


_FIGURE_TITLES = {attr: title for attr, title, _ in _RANK_COLUMNS}


def _rank_cell(r: RankStats, attr: str, fmt: Callable[[Any], str]) -> str:
    """One figure of a rank's row: bytes with the calls of unknown size they leave out; a
    straggler time or a wait caused its timed calls cannot give (no group to pair them by) as ``?``."""
    if attr == "bytes":
        return format_known_bytes(r.bytes, r.unknown_size)
    if attr == "straggler_s" and r.straggler_s is None and r.timed:
        return UNKNOWN
    if attr == "caused_wait_s" and r.caused_wait_s is None and r.timed_without_group:
        return UNKNOWN
    return fmt(r.share if attr == "share" else getattr(r, attr))


def _deviation(d: Deviation) -> str:
    if d.figure is None:
        return "median"
    if d.figure == "caused_wait_s":  # measured against the median rank's communication time
        return f"caused {d.relative * 100:+.0f}% of comm time"
    return f"{_FIGURE_TITLES[d.figure]} {d.relative * 100:+.0f}%"


def worst_steps_text(r: RankStats) -> str:
    """``6 +1.04 s, 7 +882 ms``: a rank's worst steps and its excess over the median rank there."""
    return ", ".join(f"{w.step} +{format_duration(w.excess_s)}" for w in r.worst_steps) or "-"


def render_report(rep: Report, top: int | None = None) -> str:
    """The report as text, ending with a newline; with `top`, the rank table lists only the
    `top` ranks furthest from the median, furthest first, with a ``deviation`` column."""
    away = rep.absence
    of = ""
    if away is not None and away.elsewhere:  # a node's folder: say so before any figure
        where = away.scope.where() if away.scope is not None else "the dumps read"
        of = f" of {away.world_size} ({who(away.elsewhere)} not in {where}: see the note)"
    lines = [f"commdebug report: {len(rep.ranks)} rank{'s' if len(rep.ranks) != 1 else ''}{of}"
             + ("" if rep.timed else "; no timing was recorded (record with --timing): counts and bytes only")]
    if top:
        lines.append(f"ranks: the {top} of {len(rep.ranks):,} furthest from the median (--top K to change, --top 0 for all)")
    lines.append("")
    steps = any(r.worst_steps for r in rep.ranks)
    rows = [["rank", "host"] + [title for _, title, _ in _RANK_COLUMNS] + (["deviation"] if top else [])
            + (["worst steps"] if steps else [])]
    listed = rep.top(top) if top else [(r, None) for r in rep.ranks]
    for r, d in listed:
        rows.append([str(r.rank), r.host or "?"] + [_rank_cell(r, attr, fmt) for attr, _, fmt in _RANK_COLUMNS]
                    + ([_deviation(d)] if d is not None else []) + ([worst_steps_text(r)] if steps else []))
    spread = {attr: rep.spread(attr) for attr, _, _ in _RANK_COLUMNS}
    for which in ("min", "median", "max"):
        row = [which, ""]
        for attr, _, fmt in _RANK_COLUMNS:
            s = spread[attr]
            if s is None:  # no rank has the figure: "?" where some rank's cell says it is not known
                row.append(UNKNOWN if any(_rank_cell(r, attr, fmt) == UNKNOWN for r in rep.ranks) else "-")
            else:
                holder = f" (r{s[which + '_rank']})" if which != "median" else ""
                row.append(fmt(s[which]) + holder)
        rows.append(row + ([""] if top else []) + ([""] if steps else []))
    lines += align(rows, left=2)
    lines.append("")
    n = len(rep.ranks)
    if n > 1:
        lines.append(f"per op, summed over {n:,} ranks:")
    rows = [["op", "calls", "bytes", "timed", "time", "algbw GB/s", "busbw GB/s", "straggler"]]
    for o in rep.ops:
        def known(text: str, value: float | None, o: OpStats = o) -> str:  # timed, but not known: "?", never a figure
            return UNKNOWN if o.timed and value is None else text

        rows.append([o.op, str(o.calls), format_known_bytes(o.known_bytes, o.unknown_size), str(o.timed),
                     format_duration(o.time_s if o.timed else None), known(format_gbps(o.algbw_gbps), o.algbw_gbps),
                     known(format_gbps(o.busbw_gbps), o.busbw_gbps), known(format_duration(o.straggler_s), o.straggler_s)])
    lines += align(rows)
    if rep.imbalance:
        lines += [""] + imbalance_lines(rep.imbalance)
    lines += [""] + late_lines(rep.late, rep.unpaired)
    if rep.timed:
        lines.append("")
        if steps:
            lines.append("worst steps: where the rank's time most exceeds the median rank's at the same step, and by how much;")
        lines += ["straggler: time spent in calls beyond the fastest rank's time for the same call (group, sequence number);",
                  "a rank with little of it arrived last and made the others wait."]
        if any(r.caused_wait_s is not None for r in rep.ranks):
            lines.append("caused: the wait a rank made the others spend where it arrived last by its own work, with the waits it passed on "
                         "through other ranks (late ranks, above); start-up apart.")
    lines.extend(f"note: {n}" for n in rep.notes)
    return "\n".join(lines) + "\n"


def imbalance_lines(rows: list[Imbalance], limit: int = IMBALANCE_ROWS) -> list[str]:
    """The all_to_all imbalance table, worst first (at most `limit` rows), and what it means."""
    told = any(r.factor is not None for r in rows)
    if told:
        lines = ["all_to_all imbalance: per step and group, the step's most uneven call: the rank that received most,",
                 "its bytes, the members' mean, and max / mean (1.00: even):"]
    else:
        lines = ["all_to_all received, per step and group (the step's largest receive): one rank's dump tells what it",
                 "received, and from whom (recv_splits), not what the other members received: report the folder of all",
                 "ranks for the imbalance factor:"]
    table = [["step", "group", "factor", "rank", "received", "mean", "ranks", "module"]]
    for r in rows[:limit]:
        table.append([str(r.step), r.group, "-" if r.factor is None else f"{r.factor:.2f}", str(r.rank), format_bytes(r.bytes),
                      "-" if r.factor is None else format_bytes(round(r.mean_bytes)), f"{r.ranks}/{r.group_size}", r.module])
    lines += align(table, left=2)
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit:,} more rows (--json: all_to_all_imbalance)")
    if told and any(r.factor is not None and r.ranks < r.group_size for r in rows):
        lines.append("  ranks k/n: only k of the group's n members' dumps are here; the mean is theirs")
    return lines
