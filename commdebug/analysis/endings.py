"""How the ranks of a job ended, as ``commdebug check``'s data: the ``ended`` findings (a rank
whose process ended without a final dump fails the run, whatever its collectives say), and for
each rank without a final dump the call the evidence says it was last in
(:mod:`commdebug.analysis.died_in`). The words are :mod:`commdebug.render.endings`'s."""

from __future__ import annotations

from commdebug.analysis.check_digest import RankSummary
from commdebug.analysis.died_in import Candidate, died_in
from commdebug.analysis.findings import Finding, who
from commdebug.model.fault import CAUSE_NOT_RECORDED, fault_words

__all__ = ["ended_findings", "settle_last_calls"]


def ended_findings(summaries: list[RankSummary]) -> list[Finding]:
    """The ranks whose process ended without a final dump, known from a fault record (a fatal
    signal) or from a stream whose process is gone: the run failed, whatever its collectives
    say. A fatal signal after the final dump (the gloo teardown abort) is a note, not here."""
    found = []
    for s in summaries:
        if s.fault is not None and not s.fault.get("after_final_dump"):
            found.append(Finding("ended", "", None, f"rank {s.rank} ended by {fault_words(s.fault)}, without a final dump",
                                 odd_ranks=[s.rank]))
    gone = [s.rank for s in summaries if s.fault is None and not s.final and s.stream_step is not None and s.stream_alive is False]
    if gone:
        whose = "its process" if len(gone) == 1 else "their processes"
        found.append(Finding("ended", "", None, f"{who(gone)}: {whose} ended without a final dump and {CAUSE_NOT_RECORDED}",
                             odd_ranks=gone))
    return found


def settle_last_calls(summaries: list[RankSummary], beyond: dict[int, list[Candidate]]) -> None:
    """Set ``died_in`` on each rank without a final dump (its record may lack its last calls):
    from ``beyond`` (rank -> the calls other members' records show it issued after its own
    record stops), its own last call and its fault record."""
    for s in summaries:
        if s.final:
            continue
        own = None if s.last is None else Candidate(s.last.op, s.last.group, s.last.seq, s.last.source, s.last.module, s.last.step, None)
        s.died_in = died_in(beyond.get(s.rank, []), own, s.fault)
