"""``commdebug overlap`` as text: each rank's communication, compute, overlapped and exposed time
over HTA's window, the exposed time split into waiting for a late peer and transfer where every
member of its calls was profiled, then the rows of the chosen grouping, heaviest exposure first.

    overlap: 2 ranks, GPU: NCCL kernels against compute kernels
    rank  comm     compute  overlapped  exposed  waiting  transfer  overlap  steps
       0  24.3 ms  76.9 ms     3.59 ms  20.7 ms  15.1 ms   5.60 ms    14.8%  4-6
"""

from __future__ import annotations

from commdebug.analysis.findings import ranks_text
from commdebug.analysis.overlap import UNATTRIBUTED, Overlap, OverlapRow, RankOverlap
from commdebug.render.columns import align
from commdebug.units import format_duration, format_share

__all__ = ["render_overlap"]

_WHAT = {"gpu": "GPU: NCCL kernels against compute kernels (HTA 0.5.0's kinds)",
         "cpu": "CPU: gloo's work spans against the program threads' CPU ops outside collective calls"}
_ROWS_SHOWN = 20  # per rank, in text; --json has them all


def render_overlap(result: Overlap) -> str:
    """The result as text, ending with a newline."""
    n = len(result.ranks)
    devices = sorted({r.device for r in result.ranks})
    lines = [f"overlap: {n} rank{'s' if n != 1 else ''}, " + "; ".join(_WHAT[d] for d in devices)]
    rows = [["rank", "comm", "compute", "overlapped", "exposed", "waiting", "transfer", "overlap", "steps"]]
    for r in result.ranks:
        rows.append([str(r.rank), format_duration(r.comm_s), format_duration(r.compute_s), format_duration(r.overlap_s),
                     format_duration(r.exposed_s), *_split(r), format_share(r.overlap_ratio), ranks_text(r.steps) or "-"])
    lines += align(rows, left=0)
    windows = sorted({r.window for r in result.ranks})
    lines.append("covers: " + "; ".join(windows))
    if result.rows:
        lines.append("")
        lines += _rows(result)
    lines += ["", "comm: the union of the communication activities' time; overlapped: the part of it under compute; "
              "exposed: the rest, the time the rank waited for communication; overlap = overlapped / comm.",
              "waiting: the exposed time the rank spent waiting for the last member of its calls to arrive (fix the late rank: "
              "commdebug report); transfer: the rest, the data moving (fix it with overlap: prefetch, bucket sizes, or less data)."]
    unknown = sorted({r.rank for r in result.ranks if r.exposed_wait_s is None}
                     | {r.rank for r in result.rows if r.exposed_wait_s is None and r.exposed_s > 0})
    if unknown:
        lines.append(f"note: {_ranks(unknown)}: the split of exposed time into waiting and transfer is not known ('-'): it needs "
                     "every member of each call profiled in this folder, with its group named (one trace alone, or gloo "
                     "traces that name no group, cannot say how long the others took)")
    if result.without_profile:
        lines.append(f"note: {_ranks(result.without_profile)} have no profile (record with `commdebug run --profile-steps`)")
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines) + "\n"


def _rows(result: Overlap) -> list[str]:
    by = result.by
    step = by == "step"
    title = ("by step (each ProfilerStep's own activities; * outside HTA's window):" if step else
             f"by {by} (the rows' exposed time adds up to the rank's; an instant of several collectives' "
             "communication is shared among them):")
    table = [["rank", by, "calls", "comm", "overlapped", "exposed", "waiting", "transfer", "overlap"] + (["compute"] if step else [])]
    shown: dict[int, int] = {}
    hidden = 0
    for r in result.rows:
        shown[r.rank] = shown.get(r.rank, 0) + 1
        if shown[r.rank] > _ROWS_SHOWN and not step:
            hidden += 1
            continue
        key = _key(r.key, by) + ("*" if step and not r.in_window else "")
        table.append([str(r.rank), key, str(r.calls), format_duration(r.comm_s), format_duration(r.overlap_s),
                      format_duration(r.exposed_s), *_split(r), format_share(r.overlap_ratio)]
                     + ([format_duration(r.compute_s)] if step else []))
    out = [title] + align(table, left=2)
    if hidden:
        out.append(f"  ... {hidden} more rows (--json has them all)")
    return out


def _key(key: object, by: str) -> str:
    if key == UNATTRIBUTED:
        return "unattributed"
    if key is None:  # a call that moves no FSDP unit's parameters (--by unit)
        return "(no unit)" if by == "unit" else "-"
    return str(key)


def _split(r: RankOverlap | OverlapRow) -> list[str]:
    """The waiting and transfer columns: '-' where the split is not known."""
    if r.exposed_wait_s is None or r.exposed_transfer_s is None:
        return ["-", "-"]
    return [format_duration(r.exposed_wait_s), format_duration(r.exposed_transfer_s)]


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {ranks_text(ranks)}"
