"""``commdebug check`` as text: a verdict line, how each rank ended, then each finding (with its
step, where the dumps record steps) and its sides, then notes.

    consistent: 2 ranks, 1 group, 24 collectives per rank
      ranks 0-1: ended by exit; last all_reduce #23 on default_pg[2] at train.py:34
"""

from __future__ import annotations

from commdebug.analysis.check import CheckResult, Finding, LastCall, Side, who
from commdebug.ops import shape_rule
from commdebug.render.endings import describe_died, rank_ending
from commdebug.render.late import late_headline
from commdebug.units import UNKNOWN, format_bytes

__all__ = ["render_check", "describe_finding", "describe_side", "describe_last", "no_verdict"]

# Up to this many ranks every line is shown; beyond, the most common ending and the unusual ones
# up to this many lines in all (--json lists every rank).
ALL_RANKS_UP_TO = 16


def render_check(result: CheckResult) -> str:
    """The check's verdict, the ranks' endings, the findings and notes, ending with a newline.

    >>> print(render_check(check_path("traces/")))   # doctest: +SKIP
    """
    what = _header(result)
    among = f" {result.among}" if result.among else ""  # a node's folder: the verdict covers its ranks
    if result.consistent:
        lines = [f"consistent{among}: {what}"]
    else:
        n = len(result.findings)
        lines = [f"INCONSISTENT{among}: {n} finding{'s' if n != 1 else ''} in {what}"]
    late = late_headline(result.late)
    if late is not None:  # a fact about speed, not about consistency: the exit status ignores it
        lines.append(f"  {late}")
    lines.extend(f"  {line}" for line in _endings(result))
    for i, f in enumerate(result.findings, 1):
        if i == 1:
            lines.append("")
        lines.append(f"{i}. [{f.kind}] {describe_finding(f)}")
        lines.extend(f"     {describe_side(side)}" for side in f.sides)
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines) + "\n"


def no_verdict(result: CheckResult) -> str | None:
    """Why the check can give no verdict (its calls name no process group to pair them across
    ranks by), or None when it gives one: ``commdebug check``'s error and the folder page's Check
    panel say the same."""
    if result.compared:
        return None
    traces = all(s.source_format == "torch-profiler" for s in result.rank_summaries)
    where = "their torch.profiler traces record none" if traces else "their files record none"
    return (f"nothing to check: the ranks' collectives name no process group ({where}), so no call can be paired "
            "across ranks; record the job with `commdebug run` (its dumps name their groups; --profile-steps adds the profile)")


def _header(result: CheckResult) -> str:
    """"2 ranks, 1 group, 24 collectives per rank" (a range when ranks differ)."""
    ranks, groups = len(result.ranks), result.groups
    low, high = result.collectives_per_rank
    count = str(low) if low == high else f"{low}-{high}"
    return (f"{ranks} rank{'s' if ranks != 1 else ''}, {groups} group{'s' if groups != 1 else ''}, "
            f"{count} collective{'s' if high != 1 else ''} per rank")


def describe_finding(f: Finding) -> str:
    """A finding's line after its number and kind: its message and, where the dumps record
    steps, "(step 8)". The folder page shows the same text (visualizer.ranks_data embeds it)."""
    return f.message + ("" if f.step is None else f" (step {f.step})")


def describe_side(side: Side) -> str:
    """"ranks 0-2: all_reduce 1.00 KiB float32 (unfinished) in Global at train.py:3"."""
    ranks = who(side.ranks) + (" (last call on the group)" if side.last_call else "")
    if side.op is None:
        return f"{ranks}: nothing"
    # None: an all_to_all's own sizes (they differ by rank, by design), else a size not known
    balanced = (rule := shape_rule(side.op)) is not None and rule.balanced
    size = ("" if balanced else f" {UNKNOWN}") if side.size_bytes is None else f" {format_bytes(side.size_bytes)}"
    pair = f" to rank {side.to_rank}" if side.to_rank is not None else f" from rank {side.from_rank}" if side.from_rank is not None else ""
    what = f"{side.op}{size}{pair}{' ' + side.dtype if side.dtype else ''}"
    where = "".join(f" {k} {v}" for k, v in (("in", side.module), ("at", side.source)) if v and v != "?")
    flight = " (unfinished)" if side.in_flight else ""
    return f"{ranks}: {what}{flight}{where}"


def describe_last(last: LastCall | None) -> str:
    """"all_reduce #3 on default_pg[2] at train.py:9 (unfinished)", "(failed)" where it raised
    without hanging first; a send names its peer."""
    if last is None:
        return "no collective recorded"
    if last.seq is not None:
        what = f"{last.op} #{last.seq} on {last.group}"
    else:
        peer = "" if last.peer is None else (f" to rank {last.peer}" if last.op == "send" else f" from rank {last.peer}")
        what = f"{last.op}{peer} on {last.group}"
    where = f" at {last.source}" if last.source else (f" in {last.module}" if last.module else "")
    # a hang that a timeout ended is both: unfinished says more (the ending names the error)
    return what + where + (" (unfinished)" if last.in_flight else " (failed)" if last.failed else "")


def _endings(result: CheckResult) -> list[str]:
    """One line per set of ranks that ended the same way at the same last call; ranks with no
    dump from the no_dump finding, and the ranks not in the folders read. Many ranks: the most common line, then the unusual ones."""
    lines: dict[str, list[int]] = {}
    for s in result.rank_summaries:
        last = describe_died(s.died_in) if s.died_in is not None else describe_last(s.last)
        lines.setdefault(f"{rank_ending(s, with_call=False)}; last {last}", []).append(s.rank)
    absent = [r for f in result.findings if f.kind == "no_dump" for side in f.sides for r in side.ranks]
    if absent:
        lines["left no dump"] = absent
    away = result.absence
    if away is not None and away.elsewhere:
        lines[f"not in {away.scope.where() if away.scope is not None else 'the dumps read'} (see the note)"] = list(away.elsewhere)
    if len(result.rank_summaries) > ALL_RANKS_UP_TO:
        return _few(lines)
    return [f"{who(ranks)}: {text}" for text, ranks in sorted(lines.items(), key=lambda kv: kv[1][0])]


def _few(lines: dict[str, list[int]]) -> list[str]:
    """The most common line first (with a count, not a rank list), then the rest in rank order,
    at most :data:`ALL_RANKS_UP_TO` lines."""
    common, *rest = sorted(lines.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    out = [f"{len(common[1])} ranks: {common[0]}"]
    rest.sort(key=lambda kv: kv[1][0])
    shown = rest[: ALL_RANKS_UP_TO - 1]
    out.extend(f"{who(ranks)}: {text}" for text, ranks in shown)
    hidden = rest[len(shown):]
    if hidden:
        n = sum(len(ranks) for _, ranks in hidden)
        out.append(f"... {n} more rank{'s' if n != 1 else ''} ended otherwise ({len(hidden)} more lines; --json lists every rank)")
    return out
