"""How a rank ended, in words: one wording for ``check``, ``watch`` and the folder page.

    >>> error_line("RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out")
    'RuntimeError: Timed out'
"""

from __future__ import annotations

import re

from commdebug.analysis.check_digest import RankSummary
from commdebug.model.fault import CAUSE_NOT_RECORDED, fault_words

__all__ = ["error_line", "rank_ending", "ENDING_CHARS"]

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


def rank_ending(s: RankSummary) -> str:
    """How one rank's recording ended, from ``check``'s summary of it: its final dump's
    ``ended_by``; a fatal signal, where its fault record says so; or, for a rank that left only
    its stream, what is known (still running, or ended with the cause not recorded). The words
    ``commdebug check`` prints after "rank N: " and the folder page's "ending".

    >>> result = commdebug.check(commdebug.iter_ranks("traces/"))      # doctest: +SKIP
    >>> [commdebug.rank_ending(s) for s in result.rank_summaries]      # doctest: +SKIP
    ['ended by exit', 'ended by SIGSEGV (a segmentation fault), main thread at train.py:14 in load_batch, ...']
    """
    fault = s.fault if s.fault is not None and not s.fault.get("after_final_dump") else None
    if s.stream_step is not None and not s.final:
        torn = ", its last chunk torn" if s.stream_torn else ""
        called = f", its last collective in step {s.last.step}" if s.last is not None and s.last.step is not None else ""
        stops = f"only its stream is left{torn}: it stops in step {s.stream_step}{called}"
        if fault is not None:
            return f"ended by {fault_words(fault)}, without a final dump; {stops}"
        if s.stream_alive:
            return f"still running: no final dump yet; its stream says step {s.stream_step}{called}"
        if s.stream_alive is False:
            return f"its process ended without a final dump and {CAUSE_NOT_RECORDED}; {stops}"
        return f"no final dump; {stops} (it still runs, or its process ended and {CAUSE_NOT_RECORDED})"
    if fault is not None:
        hang = "; its last dump was written by the hang watchdog" if s.ended_by == "hang" else ""
        return f"ended by {fault_words(fault)}, without a final dump{hang}"
    if s.ended_by is None:
        return "ending not recorded" + _WHAT.get(s.source_format, "")
    if s.ended_by == "hang":
        return "hung (dump written by the hang watchdog)"
    if s.ended_by == "context exit":
        return "the CommDebugMode context ended normally"
    return f"ended by {error_line(s.ended_by)}"
