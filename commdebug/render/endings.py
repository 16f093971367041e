"""How a rank ended, in words: one wording for ``check``, ``watch`` and the folder page.

    >>> error_line("RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out")
    'RuntimeError: Timed out'
"""

from __future__ import annotations

import re
from typing import Any

from commdebug.analysis.check_digest import RankSummary
from commdebug.analysis.died_in import Candidate, DiedIn
from commdebug.model.fault import CAUSE_NOT_RECORDED, fault_words

__all__ = ["error_line", "error_ending", "rank_ending", "describe_died", "describe_candidate", "ENDING_CHARS"]

# an exception's message can be long or span lines; the text keeps its start (--json all of it)
ENDING_CHARS = 80
# "RuntimeError: [/build/gloo/.../unbound_buffer.cc:78] Timed out ...": the C++ location says
# nothing to the user and would fill the line
_CPP_LOCATION = re.compile(r"^(\w[\w.]*: )\[[^\]]*\]\s*")
# files that record no ending, by format
_WHAT = {"flight-recorder": " (Flight Recorder dump)", "torch-profiler": " (a torch.profiler trace)"}


def error_line(text: str, most: int = ENDING_CHARS) -> str:
    """An error (``metadata.ended_by``) on one short line: its first line, without the C++
    source location gloo and c10d put before the message, cut to `most` characters with "..."."""
    lines = text.strip().splitlines() or [""]
    line = _CPP_LOCATION.sub(r"\1", lines[0])
    if len(line) > most or len(lines) > 1:
        line = line[:most].rstrip() + "..."
    return line


def error_ending(ended_by: str, raised_at: dict[str, Any] | None) -> str:
    """An error ending on one line (:func:`error_line`) and where the program raised it: the
    innermost line of the program's own code in its traceback (``metadata.raised_at``).

    >>> error_ending("ValueError: bad batch", {"file": "train.py", "line": 42, "function": "load"})
    'ValueError: bad batch, at train.py:42 in load'
    """
    where = f", at {raised_at.get('file')}:{raised_at.get('line')} in {raised_at.get('function')}" if raised_at else ""
    return error_line(ended_by) + where


def describe_candidate(c: Candidate) -> str:
    """"all_to_all #7 on default_pg[2] at job.py:21"."""
    return (f"{c.op} #{c.seq}" if c.seq is not None else c.op) + f" on {c.group}" + (f" at {c.source}" if c.source else "")


def describe_died(d: DiedIn) -> str:
    """The call a rank's evidence says it was last in, and the evidence: "all_to_all #7 on
    default_pg[2] at job.py:21, the call it died in (its fault record's line; rank 0's record
    shows it completed)", or its last known call where only the peers' records name it."""
    c = d.call
    call = describe_candidate(c)
    peer = f"rank {c.completed_by}'s record shows it completed" if c.completed_by is not None else ""
    if d.fault_line:
        return f"{call}, the call it died in (its fault record's line{'; ' + peer if peer else ''})"
    return f"{call}, its last known call ({peer}, so it issued it)"


def rank_ending(s: RankSummary, with_call: bool = True) -> str:
    """How one rank's recording ended, from ``check``'s summary of it: its final dump's
    ``ended_by``; a fatal signal, where its fault record says so; or, for a rank that left only
    its stream, what is known (still running, or ended with the cause not recorded). The words
    ``commdebug check`` prints after "rank N: " and the folder page's "ending"; with
    ``with_call`` (the page), the call a rank that died was in, where the evidence names it
    (``check`` names it as the rank's last call instead).

    >>> result = commdebug.check(commdebug.iter_ranks("traces/"))      # doctest: +SKIP
    >>> [commdebug.rank_ending(s) for s in result.rank_summaries]      # doctest: +SKIP
    ['ended by exit', 'ended by SIGSEGV (a segmentation fault), main thread at train.py:14 in load_batch, ...']
    """
    fault = s.fault if s.fault is not None and not s.fault.get("after_final_dump") else None
    died = f"; last {describe_died(s.died_in)}" if with_call and s.died_in is not None else ""
    if s.stream_step is not None and not s.final:
        torn = ", its last chunk torn" if s.stream_torn else ""
        last = s.died_in.call if s.died_in is not None else s.last  # what the peers' records add to its own
        called = f", its last collective in step {last.step}" if last is not None and last.step is not None else ""
        stops = f"only its stream is left{torn}: it stops in step {s.stream_step}{called}"
        if fault is not None:
            return f"ended by {fault_words(fault)}, without a final dump; {stops}{died}"
        if s.stream_alive:
            return f"still running: no final dump yet; its stream says step {s.stream_step}{called}{died}"
        if s.stream_alive is False:
            return f"its process ended without a final dump and {CAUSE_NOT_RECORDED}; {stops}{died}"
        return f"no final dump; {stops} (it still runs, or its process ended and {CAUSE_NOT_RECORDED}){died}"
    if fault is not None:
        hang = "; its last dump was written by the hang watchdog" if s.ended_by == "hang" else ""
        return f"ended by {fault_words(fault)}, without a final dump{hang}{died}"
    if s.ended_by is None:
        return "ending not recorded" + _WHAT.get(s.source_format, "")
    if s.ended_by == "hang":
        return "hung (dump written by the hang watchdog)"
    if s.ended_by == "context exit":
        return "the CommDebugMode context ended normally"
    return f"ended by {error_ending(s.ended_by, s.raised_at)}"
