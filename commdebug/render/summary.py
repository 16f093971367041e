"""The summary as text: a header like mpitrace's (elapsed, communication time and share), then
one aligned row per group; over a job's ranks, then how each row varies across ranks. Sizes in
KiB/MiB (base 1024), bandwidths in GB/s (1e9 bytes/s). Also the ``--json`` form, which adds the
size bins' labels to the analysis' data."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from commdebug.analysis.check import who
from commdebug.analysis.summary import Summary, SummaryRow
from commdebug.analysis.traffic import PeerRow
from commdebug.render.columns import align
from commdebug.render.table import light_note
from commdebug.units import UNKNOWN, format_bytes, format_duration, format_gbps, format_known_bytes

__all__ = ["render_summary", "summary_dict", "key_titles", "key_cells", "key_dict", "size_bin_label", "render_peers", "peers_dict"]


def size_bin_label(bounds: tuple[int, int] | None) -> str:
    """A size bin ``[lo, hi)`` as text; ``?`` for the calls whose size is not known.

    >>> size_bin_label((65536, 131072)), size_bin_label(None)
    ('64.00 KiB - 128.00 KiB', '?')
    """
    if bounds is None:
        return UNKNOWN
    lo, hi = bounds
    return "0 B" if hi == 0 else f"{format_bytes(lo)} - {format_bytes(hi)}"


_KEY_CELLS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "op": ("op", str),
    "size_bytes": ("size", format_bytes),
    "size_bin": ("size bin", size_bin_label),
    "module": ("module", str),
    "group": ("group", str),
    "step": ("step", str),
    "phase": ("phase", str),
}


def key_titles(keys: Iterable[str]) -> list[str]:
    """The column titles of a row's grouping keys: ``key_titles(["op", "size_bytes"]) == ["op", "size"]``."""
    return [_KEY_CELLS[k][0] for k in keys]


def key_cells(key: dict[str, Any]) -> list[str]:
    """A row's grouping values as cells: ``key_cells({"op": "all_reduce", "size_bytes": 1536}) == ["all_reduce", "1.50 KiB"]``."""
    return [_KEY_CELLS[k][1](v) for k, v in key.items()]


def key_dict(key: dict[str, Any]) -> dict[str, Any]:
    """A row's grouping values for JSON: a size bin as ``[lo, hi]`` followed by its label.

    >>> key_dict({"op": "all_reduce", "size_bin": (1024, 2048)})
    {'op': 'all_reduce', 'size_bin': [1024, 2048], 'size_bin_label': '1.00 KiB - 2.00 KiB'}
    """
    out: dict[str, Any] = {}
    for k, v in key.items():
        if k == "size_bin":
            out.update(size_bin=None if v is None else list(v), size_bin_label=size_bin_label(v))
        else:
            out[k] = v
    return out


def summary_dict(summary: Summary, header: bool = True) -> dict[str, Any]:
    """The ``--json`` form (docs/summary.md): :meth:`Summary.to_dict` with each size bin's label
    beside its bounds; without ``header``, no ``header`` key.

    >>> summary_dict(summarize(trace, "op,bin"))["rows"][0]["size_bin_label"]   # doctest: +SKIP
    '64.00 KiB - 128.00 KiB'
    """
    data = summary.to_dict()
    data["rows"] = [{**key_dict(r.key), **{k: v for k, v in d.items() if k not in r.key}} for r, d in zip(summary.rows, data["rows"], strict=True)]
    if not header:
        del data["header"]
    return data


def _seconds(value: float | None) -> str:
    return format_duration(value)


def _summed(h: dict[str, Any], seconds: float | None) -> str:
    """" summed over 1,024 ranks (7.41 ms per rank)" for a job's total, nothing for one rank."""
    n = len(h["ranks"]) if "ranks" in h else 0
    if not n or seconds is None:
        return ""
    return f" summed over {n:,} rank{'s' if n != 1 else ''} ({format_duration(seconds / n)} per rank)"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _hosts(names: list[str]) -> str:
    if not names:
        return "?"
    return ", ".join(names) if len(names) <= 3 else f"{len(names)} hosts"


def _header_lines(summary: Summary) -> list[str]:
    h = summary.header
    job = "ranks" in h
    where = (f"{who(h['ranks'])} of {h.get('world_size') or '?'} on {_hosts(h['hostnames'])}" if job
             else f"rank {h.get('rank', '?')} of {h.get('world_size', '?')} on {h.get('hostname') or '?'}")
    lines = [f"commdebug summary by {summary.by}: {where}, {_plural(h.get('steps', 0), 'step')},"
             f" {h['collectives']} collectives, {_bytes_words(h['bytes'], h.get('unknown_size_calls') or 0)}"]
    elapsed = f"elapsed {_seconds(h['elapsed_s'])}" + (" (the longest rank)" if job and h["elapsed_s"] is not None else "")
    if h["timed_collectives"] > 0:
        share = _share_words(h, job)
        summed = _summed(h, h["comm_time_s"])
        lines.append(f"{elapsed}, recorded {_seconds(h['recorded_s'])}, communication {_seconds(h['comm_time_s'])}{summed}{share},"
                     f" timing {h['timing']}"
                     + ("" if h["timed_collectives"] == h["collectives"] else f" ({h['timed_collectives']} of {h['collectives']} calls timed)"))
    else:
        lines.append(f"{elapsed}; no timing was recorded (timing {h['timing']}): counts and bytes only")
    note = light_note(h)
    if note:
        lines.append(note)
    if h.get("cluster") is not None:
        lines.append(f"predicted on cluster {h['cluster']}: {format_duration(h['predicted_s'])} of communication{_summed(h, h['predicted_s'])}"
                     " (a model, not a measurement: docs/estimate.md); 'pred' columns are predicted")
        lines += [f"note: {note}" for note in h.get("prediction_notes") or []]
    lines += [f"note: {note}" for note in h.get("timing_notes") or []]
    if h.get("events_dropped"):
        lines.append(f"note: {h['events_dropped']} older calls were dropped (max_events); rows cover the calls kept")
    if h.get("totals_only"):
        lines.append(f"note: {h['totals_only']} calls of older steps are kept as totals (keep_steps, max_events): counted in every row, "
                     "not in the busbw percentiles")
    lines += [f"note: {note}" for note in h.get("read_notes") or []]
    return lines


def _share_words(h: dict[str, Any], job: bool) -> str:
    """" (3.4% of recorded time)"; where only some steps were timed (a profile of steps 1-3),
    over those steps' time, and said; where their time is not known, no share, and why."""
    steps = h.get("timed_steps")
    if steps:
        timed, total = steps
        if h["comm_share"] is None:
            return (f" (no share: its calls were timed in {timed} of the {total} steps, whose durations were not recorded)"
                    if not job else f" (no share: the calls were timed in {timed} of the {total} steps, whose durations were not recorded)")
        return f" ({h['comm_share'] * 100:.1f}% of the time of the {timed} timed steps, of {total})"
    return "" if h["comm_share"] is None else f" ({h['comm_share'] * 100:.1f}% of {'their ' if job else ''}recorded time)"


def _bytes_words(nbytes: int | None, unknown: int) -> str:
    """The header's bytes: "1.50 KiB", "1.50 KiB (3 calls of unknown size not in it)", "bytes
    unknown (no call's size was recorded)"."""
    if nbytes is None:
        return "bytes unknown (no call's size was recorded)"
    return format_bytes(nbytes) + (f" ({_plural(unknown, 'call')} of unknown size not in it)" if unknown else "")


def _row_cells(r: SummaryRow, predicted: bool, timed: bool) -> list[str]:
    cells = key_cells(r.key) + [str(r.calls), format_known_bytes(r.bytes, r.unknown_size_calls)]
    if predicted:
        cells += [format_duration(r.predicted_s), format_gbps(r.predicted_busbw_gbps)]
    if timed:
        def bw(value: float | None) -> str:  # timed, but no size (or group size) to divide: not known, not "-"
            return UNKNOWN if value is None and r.timed_calls and r.unknown_size_calls else format_gbps(value)

        cells += [format_duration(r.time_s), format_duration(r.avg_time_s), format_duration(r.latency_min_s), format_duration(r.latency_max_s),
                  bw(r.algbw_gbps), *(_busbw(v, r) for v in (r.busbw_gbps, r.busbw_p50_gbps, r.busbw_p90_gbps, r.busbw_p99_gbps))]
    return cells


def _busbw(value: float | None, r: SummaryRow) -> str:
    """A row's busbw: ``?`` where it was timed but its sizes or its group's size are not known."""
    if value is None and r.timed_calls and (r.unknown_size_calls or r.algbw_gbps is not None):
        return UNKNOWN
    return format_gbps(value)


def _spread_cells(spread: dict[str, Any] | None, fmt: Callable[[Any], str], holders: bool) -> list[str]:
    """min, median, max; with ``holders``, min and max name their rank when the ranks differ."""
    if spread is None:
        return ["-", "-", "-"]
    named = holders and spread["min"] != spread["max"]
    return [fmt(spread["min"]) + (f" (r{spread['min_rank']})" if named else ""), fmt(spread["median"]),
            fmt(spread["max"]) + (f" (r{spread['max_rank']})" if named else "")]


def _per_rank_lines(summary: Summary, timed: bool) -> list[str]:
    keys = list(summary.rows[0].key)
    table = [key_titles(keys) + ["calls min", "median", "max"] + (["time min", "median", "max", "slowest"] if timed else [])]
    for r in summary.rows:
        spread = r.per_rank  # every row of a job's summary has one; "-" for a row that has not
        cells = key_cells(r.key) + _spread_cells(spread.calls if spread else None, lambda v: f"{v:g}", holders=True)
        if timed:  # the max's holder is the slowest column
            slowest = spread.slowest_rank if spread else None
            cells += _spread_cells(spread.time_s if spread else None, format_duration, holders=False) + ["-" if slowest is None else f"r{slowest}"]
        table.append(cells)
    title = f"per rank, over {_plural(len(summary.header['ranks']), 'rank')}: min / median / max"
    if timed:
        title += "; slowest: the rank with the most time in the row"
    return [title] + align(table, left=len(keys))


def render_summary(summary: Summary, header: bool = True) -> str:
    """The summary as text, ending with a newline; without ``header``, only the tables (no
    hostname, elapsed time or notes: output that is the same from run to run).

    >>> print(render_summary(summarize(trace, "op")))   # doctest: +SKIP
    """
    h = summary.header
    lines = _header_lines(summary) + [""] if header else []
    if not summary.rows:
        return "\n".join(lines + ["no collectives recorded"]) + "\n"
    predicted, timed = h.get("cluster") is not None, h["timed_collectives"] > 0
    keys = list(summary.rows[0].key)
    titles = key_titles(keys) + ["calls", "bytes"]
    if predicted:
        titles += ["pred time", "pred busbw GB/s"]
    if timed:
        titles += ["time", "avg", "min", "max", "algbw GB/s", "busbw GB/s", "busbw p50", "p90", "p99"]
    lines += align([titles] + [_row_cells(r, predicted, timed) for r in summary.rows], left=len(keys))
    if "ranks" in h:
        lines += [""] + _per_rank_lines(summary, timed)
    return "\n".join(lines) + "\n"


def peers_dict(rows: list[PeerRow]) -> dict[str, Any]:
    """``summary --by peer --json``: ``{"by": "peer", "rows": [{group, src, dst, calls, bytes}]}``."""
    return {"by": "peer", "rows": [r.to_dict() for r in rows]}


def render_peers(rows: list[PeerRow]) -> str:
    """``summary --by peer`` as text: one aligned row per (group, src, dst), ranks global.

    >>> print(render_peers(peer_rows_path("traces/")))   # doctest: +SKIP
    group          src  dst  calls      bytes
    default_pg[2]    0    1      6  12.00 KiB
    """
    if not rows:
        return "no all_to_all or send/recv traffic recorded\n"
    table = [["group", "src", "dst", "calls", "bytes"]]
    table += [[r.group, str(r.src), str(r.dst), str(r.calls), format_known_bytes(r.bytes, r.unknown)] for r in rows]
    return "\n".join(align(table, left=1)) + "\n"
