"""``commdebug watch`` as text: a frame per refresh, one line per rank, then the verdict.

    commdebug watch traces/: 2 ranks, median step 2, 14:03:07
    rank  step  comm (last steps)  last collective                            state
    0     2     4 / 4 / 1 calls    all_reduce #4 on default_pg[2] at job.py:21  waits 31 s in all_reduce #4 ...
    1     2     4 / 4 calls        all_reduce #3 on default_pg[2] at job.py:21  STALLED: no progress for 31 s
    STALLED: rank 1 (no progress for 31 s) while rank 0 waits in all_reduce #4 on default_pg[2] at job.py:21
"""

from __future__ import annotations

import time as _time

from commdebug.analysis.check import who
from commdebug.analysis.watch import Call, RankLive, WatchResult
from commdebug.model.fault import CAUSE_NOT_RECORDED, fault_words
from commdebug.render.columns import align
from commdebug.render.endings import describe_candidate, describe_died, error_ending
from commdebug.units import format_duration

__all__ = ["render_watch", "describe_call", "ending"]


def describe_call(call: Call | None) -> str:
    """"all_reduce #4 on default_pg[2] in Linear at job.py:21"."""
    if call is None:
        return "no collective yet"
    what = f"{call.op} #{call.seq}" if call.seq is not None else call.op
    where = "".join(f" {k} {v}" for k, v in (("in", call.module), ("at", call.source)) if v)
    return f"{what} on {call.group}{where}"


def _comm(r: RankLive) -> str:
    if not r.recent:
        return "-"
    if all(t is not None for _, _, t in r.recent):
        return " / ".join(format_duration(t) for _, _, t in r.recent)
    return " / ".join(str(c) for _, c, _ in r.recent) + " calls"


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"


def ending(r: RankLive) -> str:
    """How a rank ended, on one short line: its final dump's ending (an error as ``check``
    shows it), or the fatal signal its fault record names."""
    if r.crashed and r.fault is not None:
        return f"{fault_words(r.fault)}, without a final dump"
    return error_ending(r.ended_by or "", r.raised_at)


def _last(r: RankLive, step: bool = False) -> str:
    """"; its last collective: ..." as its record has it, or the call the evidence says it was
    last in (its fault record's line, the others' records), as ``check`` names it."""
    if r.died_in is not None:
        return f"; last {describe_died(r.died_in)}"
    if r.last is None:
        return ""
    return f"; its last collective: {describe_call(r.last)}" + (f" (step {r.last.step})" if step else "")


def _gone(r: RankLive, result: WatchResult) -> str:
    """Why a rank is gone, from what is known: this host's kernel says its process ended, or it
    has shown no sign of life since the ranks that ended did (finished, or failed)."""
    if r.alive is False:
        return "its process has ended, without a final dump"
    ended = [x for x in result.ranks if x.ended_by is not None or x.crashed]
    failed = [x.rank for x in ended if x.rank in result.failed]
    others = ("since " + (f"{who(failed)} failed" if failed else f"{who([x.rank for x in ended])} finished")) if ended else ""
    seen = max((t for t in (r.heartbeat, r.progress) if t is not None), default=None)
    idle = f" for {_age(result.now - seen)}" if seen is not None else ""
    return f"no final dump and no sign of life{idle}" + (f" {others}" if others else "")


def _state(r: RankLive, result: WatchResult) -> str:
    now = result.now
    if r.crashed or (r.ended_by is not None and r.rank in result.failed):
        return f"FAILED: ended by {ending(r)}"
    if r.ended_by is not None:
        return f"finished ({r.ended_by})"
    if r.rank in result.gone and r.rank not in result.stalled:
        return f"GONE: {_gone(r, result)}"
    if r.rank in result.stalled:
        idle = _age(now - r.progress) if r.progress is not None else "a while"
        gone = " and no sign of life: the process may be gone" if r.rank in result.gone else ""
        return f"STALLED: no progress for {idle}{gone}"
    if r.waiting is not None:
        return f"waits{_since(result, r.waiting)} in {describe_call(r.waiting)}"
    if r.rank in result.stragglers and result.running_median_step is not None:
        return f"STRAGGLER: {result.running_median_step - r.step:g} steps behind the median"
    return "running"


def _since(result: WatchResult, call: Call) -> str:
    return f" {_age(result.now - call.since)}" if call.since else ""


WAITED_FOR_NAMED = 3  # ranks waited for, named with the line they were last seen at


def _waited_for(result: WatchResult, calls: list[Call]) -> str:
    """"; they wait for rank 3, last seen in barrier #4 on default_pg[4] at job.py:28" (the
    members of the calls' groups that are not in them), or "" where the dumps do not say."""
    named: dict[int, str] = {}
    for call in calls:
        for r in result.waited_for(call):
            named.setdefault(r.rank, "last seen in " + (describe_call(r.last) if r.last else "no collective yet"))
    if not named:
        return ""
    ranks = sorted(named)
    if len(ranks) == 1:
        return f"; they wait for rank {ranks[0]}, {named[ranks[0]]}"
    seen = ", ".join(f"rank {r} {named[r]}" for r in ranks[:WAITED_FOR_NAMED])
    more = f", and {len(ranks) - WAITED_FOR_NAMED} more" if len(ranks) > WAITED_FOR_NAMED else ""
    return f"; they wait for {who(ranks)} ({seen}{more})"


def render_watch(result: WatchResult, title: str = "") -> str:
    """One frame: a header, a line per rank, the verdict and notes, ending with a newline."""
    n = len(result.ranks)
    median = "-" if result.median_step is None else f"{result.median_step:g}"
    clock = _time.strftime("%H:%M:%S", _time.localtime(result.now))
    over = "; the run is over: every rank has ended" if result.over else ""
    lines = [f"commdebug watch{' ' + title if title else ''}: {n} rank{'s' if n != 1 else ''}, median step {median}, {clock}{over}"]
    rows = [["rank", "step", "comm (last steps)", "last collective", "state"]]
    for r in result.ranks:
        # a rank gone without a final dump: the call the evidence says it was last in, not its record's
        last = describe_candidate(r.died_in.call) + " *" if r.died_in is not None else describe_call(r.last)
        rows.append([str(r.rank), str(r.step), _comm(r), last, _state(r, result)])
    lines += align(rows, left=5)
    if any(r.died_in is not None for r in result.ranks):
        lines.append("* known from its fault record or the other ranks' records: its own record stops before it")
    lines += _verdict(result)
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def _verdict(result: WatchResult) -> list[str]:
    out = []
    waiting = result.waited_in()
    if result.stalled:
        for rank in result.stalled:
            r = result.rank(rank)
            idle = f"no progress for {_age(result.now - r.progress)}" if r.progress is not None else "no progress"
            last = _last(r, step=True)
            others = "; ".join(f"{who([w])} waits in {describe_call(c)}" for w, c in waiting)
            out.append(f"STALLED: rank {rank} ({idle}{last})" + (f" while {others}" if others else ""))
    if result.hung:
        calls = "; ".join(f"{who([w])} in {describe_call(c)}" for w, c in waiting)
        out.append(f"HUNG: every rank waits in a collective ({calls}); `commdebug check` names the calls that differ")
    if result.stragglers:
        out.append(f"STRAGGLING: {who(result.stragglers)} more than {result.behind_pct:g}% behind the median step {result.running_median_step:g}"
                   + (" of the ranks still running" if result.finished else ""))
    for rank in result.failed:
        r = result.rank(rank)
        out.append(f"FAILED: rank {rank} ended by {ending(r)}{_last(r)}")
    for rank in result.gone:
        if rank in result.stalled:
            continue  # said above
        r = result.rank(rank)
        out.append(f"GONE: rank {rank} stopped in step {r.step}: {_gone(r, result)}; {CAUSE_NOT_RECORDED}{_last(r, step=True)}")
    if result.apart and not result.hung:
        calls = "; ".join(f"rank {w} waits{_since(result, c)} in {describe_call(c)}" for w, c in waiting if w in result.apart)
        out.append(f"WAITING APART: {calls}: calls that differ on one group never match; a hang unless it clears "
                   f"within {result.stall_after:g} s (--stall-after); `commdebug check` names where the ranks parted")
    if not out and waiting:
        calls = "; ".join(f"{who([w])} waits{_since(result, c)} in {describe_call(c)}" for w, c in waiting)
        out.append(f"waiting: {calls}{_waited_for(result, [c for _, c in waiting])} "
                   f"(a hang if every rank still waits after {result.stall_after:g} s)")
    if not out:
        live = len(result.ranks) - len(result.finished)
        out.append("healthy" + (f": {live} running" if live else "") + (f", {len(result.finished)} finished" if result.finished else ""))
    return out
