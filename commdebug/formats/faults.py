"""A rank's fault record (``rank<R>.fault``, written when its process died of a signal:
:mod:`commdebug.launch.faults`) attached to what the readers read of the rank, so every verb says
how it ended (:mod:`commdebug.model.fault` holds the record's format and words)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from commdebug.model.fault import FAULT_SUFFIX, fault_words, parse_fault
from commdebug.model.rank_view import RankView
from commdebug.model.trace import Trace

__all__ = ["with_fault"]

_Read = TypeVar("_Read", Trace, RankView)


def with_fault(data: _Read, path: Path) -> _Read:
    """``data`` with its rank's fault record in ``metadata.fault``, when there is one of this
    process (see :mod:`commdebug.model.fault`): ``rank<R>.fault`` beside the file, or
    ``pid<P>.fault`` for a process that died before its rank was known. The record says
    whether it came after the final dump (``after_final_dump``: the dump is complete) and,
    in ``words``, what it means."""
    meta = data.metadata
    pid = meta.get("pid")
    if not isinstance(pid, int):
        return data  # a dump of no known process: no record can be shown to be its own
    for candidate in (path.with_suffix(FAULT_SUFFIX), path.with_name(f"pid{pid}{FAULT_SUFFIX}")):
        try:
            raw = candidate.read_bytes()
        except OSError:
            continue
        record = parse_fault(raw)
        if record is None or record.pid != pid:
            continue  # empty, or another process's (an earlier run's in a reused folder)
        run = meta.get("run_id")
        if record.run_id is not None and isinstance(run, str) and record.run_id != run:
            continue
        fault = record.to_dict()
        fault["file"] = str(candidate)
        fault["after_final_dump"] = meta.get("ended_by") not in (None, "hang")
        fault["words"] = fault_words(fault)
        meta["fault"] = fault
        break
    return data
