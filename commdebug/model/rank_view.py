"""One rank's collectives as the offline tools see them (:class:`RankView`): metadata, groups
and events, without the module tree. :mod:`commdebug.formats.readers` makes them from our dumps
and from Flight Recorder's, one file at a time, so a thousand ranks never sit in memory together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.model.trace import CollectiveEvent, GroupInfo

__all__ = ["RankView"]


@dataclass
class RankView:
    """One rank's collectives: enough for reports, checks and traces, without the module tree."""

    rank: int
    path: Path
    metadata: dict[str, Any]
    groups: dict[str, GroupInfo]
    events: list[CollectiveEvent]
    source_format: str = "commdebug"  # or "flight-recorder"
    notes: list[str] = field(default_factory=list)
    # group name -> the last sequence number this rank saw completed, where the dump says
    # (Flight Recorder's pg_status); absent: unknown
    completed: dict[str, int] = field(default_factory=dict)
