"""The words for late ranks (:mod:`commdebug.analysis.late`): ``report``'s section, ``check``'s
header line.

    late ranks: who arrived last and made the others wait, worst first (listed where a rank waited
    over 50 ms and 10% of the step's median communication time for it):
      step 3, rank 3: made 1 rank wait 500 ms (500 ms at most) in all_reduce #3 on group 2[2] at job.py:24
        before it: 501 ms since all_reduce #2 at job.py:25 ended (the ranks that waited: 1.02 ms)
        passed on through all_reduce #3 on default_pg[4] at job.py:25 (rank 2 came last there): 1.50 s of waiting in all
    start-up: rank 2 reached the first collective 250 ms after rank 3 (all_reduce #0 on group 2[2] at job.py:24)
"""

from __future__ import annotations

from commdebug.analysis.late import CallSite, LateCall, LateRank, LateRanks, LateThreshold
from commdebug.units import format_duration

__all__ = ["late_lines", "late_headline", "threshold_text", "describe_late", "describe_gap", "describe_passed", "startup_lines",
           "LATE_ROWS"]

LATE_ROWS = 10  # entries the text lists, worst first (--json: all)
GAP_OPS = 3  # profiled ops of a gap named in the text
PASSED_SHOWN = 3  # calls a wait passed through named in the text
STARTUP_ROWS = 5  # start-up lines in the text


def threshold_text(t: LateThreshold) -> str:
    """"50 ms and 10% of the step's median communication time"."""
    parts = [format_duration(t.seconds)] if t.seconds else []
    if t.fraction:
        parts.append(f"{t.fraction * 100:g}% of the step's median communication time")
    return " and ".join(parts) or "nothing"


def _site(site: CallSite, group: str | None = None) -> str:
    what = f"{site.op} #{site.seq}" if site.seq is not None else site.op
    on = f" on {group}" if group else ""
    where = "".join(f" {k} {v}" for k, v in (("in", site.module if site.module != "Global" else None), ("at", site.source)) if v)
    return what + on + where


def describe_late(e: LateRank, lead: str = "step {step}, rank {rank}:") -> str:
    """"step 2, rank 3: made 3 ranks wait 2.40 s (803 ms at most) in all_reduce #5 on default_pg[4] at job.py:31"."""
    w = e.worst
    ranks = f"{w.waited} rank{'s' if w.waited != 1 else ''}"
    more = "" if len(e.calls) < 2 else f"; {len(e.calls) - 1} more late call{'s' if len(e.calls) > 2 else ''} this step"
    return (f"{lead.format(step=e.step, rank=e.rank)} made {ranks} wait {format_duration(w.caused_s)} "
            f"({format_duration(w.max_wait_s)} at most) in {_site(w.before, w.group)}{more}")


def describe_gap(c: LateCall) -> str | None:
    """"before it: 801 ms since barrier #4 at job.py:28 ended (the ranks that waited: 423 us)";
    None where the dumps have no start times, or the call was its rank's first (no gap: a gap is
    only ever between two calls of one process)."""
    if c.gap_s is None or c.after is None:
        return None
    others = "" if c.others_gap_s is None else f" (the ranks that waited: {format_duration(c.others_gap_s)})"
    return f"before it: {format_duration(c.gap_s)} since {_site(c.after, c.after.group)} ended{others}"


def describe_passed(c: LateCall) -> str | None:
    """"passed on through all_reduce #3 on default_pg[4] at job.py:25 (rank 2 came last there): 1.50
    s of waiting in all"; None where the wait went nowhere else."""
    if not c.through:
        return None
    named = [f"{_site(CallSite(t.op, t.seq, t.source, None), t.group)} (rank {t.rank} came last there)" for t in c.through[:PASSED_SHOWN]]
    more = len(c.through) - PASSED_SHOWN
    tail = f" and {more} more call{'s' if more != 1 else ''}" if more > 0 else ""
    return f"passed on through {', '.join(named)}{tail}: {format_duration(c.chain_caused_s)} of waiting in all"


def late_headline(late: LateRanks | None) -> str | None:
    """``check``'s line on the worst late rank (a root: the rank whose own work made it late),
    or None when none is listed."""
    if late is None or not late.entries:
        return None
    e = late.entries[0]
    more = len(late.entries) - 1
    tail = f"; {more} more late (step, rank) pair{'s' if more != 1 else ''}" if more else ""
    passed = f", {format_duration(e.worst.chain_caused_s)} with the waits it passed on" if e.worst.through else ""
    return f"late rank: {describe_late(e, 'rank {rank} at step {step}')}{passed}{tail} (commdebug report lists them)"


def startup_lines(late: LateRanks | None, limit: int = STARTUP_ROWS) -> list[str]:
    """``report``'s start-up skew lines, longest first: "start-up: rank 2 reached the first
    collective 250 ms after rank 3 (all_reduce #0 on group 2[2] at job.py:24)"; none where
    nobody waited over the threshold at the start."""
    if late is None or not late.startup:
        return []
    lines = [(f"start-up: rank {s.rank} reached the first collective" if s.first_call else
              f"start-up: rank {s.rank}, before any call had made it meet the others, came")
             + f" {format_duration(s.skew_s)} after rank {s.after} ({_site(CallSite(s.op, s.seq, s.source, None), s.group)})"
             for s in late.startup[:limit]]
    if len(late.startup) > limit:
        lines.append(f"  ... {len(late.startup) - limit:,} more (--json: startup_skew)")
    lines.append("  (the processes reached their first collective apart: no late rank, and in no rank's wait caused)")
    return lines


def late_lines(late: LateRanks | None, unpaired: int = 0, limit: int = LATE_ROWS) -> list[str]:
    """``report``'s late-rank section: the listed (step, rank) pairs worst first, each with its
    gap, or one line saying why there are none. ``unpaired``: timed calls that name no process
    group (a trace that records none), which no other rank's call can be paired with."""
    no_group = (f"{unpaired:,} timed call{'s' if unpaired != 1 else ''} name no process group (the traces record none), "
                "and a call is compared across ranks by its group and sequence number")
    if late is None or not late.timed:
        if unpaired:
            return [f"late ranks: none can be told: {no_group}"]
        return ["late ranks: the wait a late rank caused needs timing (record with --timing; Flight Recorder dumps: "
                "with durations, TORCH_NCCL_ENABLE_TIMING=1)"]
    if not late.analysed:
        if unpaired:
            partial = (f"; the other {late.partial:,} were timed on only some members of their group" if late.partial else "")
            return [f"late ranks: none can be told: {no_group}{partial}"]
        return [f"late ranks: no call was timed on every member of its group ({late.partial:,} on only some): the wait "
                "a late rank caused needs every member's dump (a --ranks selection that leaves members out, or missing dumps)"]
    rule = threshold_text(late.threshold)
    if not late.entries:
        return [f"late ranks: none (no rank waited over {rule} for another at one call, start-up apart; --late-threshold to change)",
                *startup_lines(late)]
    lines = ["late ranks: who arrived last by their own work and made the others wait, worst first",
             f"(listed where a rank waited over {rule} for it at one call, or for a rank it held up; --late-threshold to change):"]
    for e in late.entries[:limit]:
        lines.append(f"  {describe_late(e)}")
        gap = describe_gap(e.worst)
        if gap is not None:
            lines.append(f"    {gap}")
        passed = describe_passed(e.worst)
        if passed is not None:
            lines.append(f"    {passed}")
        if e.gap_top:
            ops = ", ".join(f"{o.get('name')} {format_duration(o.get('total_s'))} (x{o.get('count')})" for o in e.gap_top[:GAP_OPS])
            queued = all(o.get("on") == "gpu" for o in e.gap_top)
            lines.append(f"    in that gap it launched on the GPU: {ops}" if queued else f"    in that gap it ran: {ops}")
    if len(late.entries) > limit:
        lines.append(f"  ... {len(late.entries) - limit:,} more (--json: late_ranks)")
    if not late.gaps_known:
        lines.append("  the gap before a late call is unknown where dumps have no start times (Flight Recorder's)")
    if late.partial:
        lines.append(f"  {late.partial:,} call{'s' if late.partial != 1 else ''} timed on only some members of their group "
                     "left out (the wait needs every member)")
    return lines + startup_lines(late)
