"""One rank's collectives as the offline tools see them (:class:`RankView`): metadata, groups
and events, without the module tree. :mod:`commdebug.formats.readers` makes them from our dumps
and from Flight Recorder's, one file at a time, so a thousand ranks never sit in memory together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.model.profile import Profile
from commdebug.model.trace import GLOBAL, CollectiveEvent, GroupInfo, Trace

__all__ = ["RankView", "trace_of_view"]


@dataclass
class RankView:
    """One rank's collectives: enough for reports, checks and traces, without the module tree."""

    rank: int
    path: Path
    metadata: dict[str, Any]
    groups: dict[str, GroupInfo]
    events: list[CollectiveEvent]
    source_format: str = "commdebug"  # or "flight-recorder", "torch-profiler"
    notes: list[str] = field(default_factory=list)
    # group name -> the last sequence number this rank saw completed, where the dump says
    # (Flight Recorder's pg_status); absent: unknown
    completed: dict[str, int] = field(default_factory=dict)
    # the rank's torch.profiler trace, read alone or joined to its dump (``overlap`` reads it)
    profile: Profile | None = None


def trace_of_view(view: RankView) -> Trace:
    """A rank view as a :class:`Trace` whose module tree is the root alone (a torch.profiler
    trace's collectives, which know no modules), for the verbs that read traces (``summary``,
    ``view``, ``diff``, ``estimate``)."""
    trace = Trace(max_events=None)
    trace.metadata = dict(view.metadata)
    for group in view.groups.values():
        trace.add_group(group)
    for e in view.events:
        trace.add_group(e.group)
        trace.add_event(e)
        trace.add_collective((GLOBAL,), e.phase, (e.key, e.op, e.group.name), e.size_bytes)
    trace.step = int(view.metadata.get("steps") or 0)
    trace.profile = view.profile
    trace.metadata.setdefault("read_notes", []).extend(view.notes)
    return trace
