"""One log line per collective (``CommDebugMode(verbose=True)``), through Python logging.

    rank=0 | op=reduce_scatter | time=9.46 ms | size=678.86 MiB | algbw=75.25 GB/s
    | busbw=65.84 GB/s | group=mesh_dp[8] | module=layers.3.mlp | at=train.py:120

(one line in the log). Bandwidths in GB/s (1e9 bytes/s), sizes base 1024. Untimed collectives
leave out time and bandwidths.
"""

from __future__ import annotations

import logging
import os

from commdebug.model.trace import CollectiveEvent
from commdebug.units import format_bytes, format_duration

__all__ = ["event_line", "VerboseLog"]

log = logging.getLogger("commdebug")


def event_line(event: CollectiveEvent, rank: int) -> str:
    """The verbose line of one collective."""
    parts = [f"rank={rank}", f"op={event.op}"]
    if event.latency_s is not None:
        parts.append(f"time={format_duration(event.latency_s)}")
    parts.append(f"size={format_bytes(event.size_bytes)}")
    if event.algbw_gbps is not None:
        parts.append(f"algbw={event.algbw_gbps:.2f} GB/s")
        parts.append(f"busbw={event.busbw_gbps:.2f} GB/s")
    parts.append(f"group={event.group.label}")
    if event.peer is not None:
        parts.append(f"peer={event.peer}")
    parts.append(f"module={event.module}")
    if event.source:
        path, _, line = event.source.rpartition(":")
        parts.append(f"at={os.path.basename(path)}:{line}")
    return " | ".join(parts)


class VerboseLog:
    """A CommDebugMode listener logging each finished collective at INFO on ``commdebug``.

    With no logging configured at all (no handler on ``commdebug`` or the root logger), INFO
    would be dropped; then it adds a stderr handler to ``commdebug``, so ``verbose=True`` shows
    something without logging set up.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        if not log.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[commdebug] %(message)s"))
            log.addHandler(handler)
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)

    def __call__(self, event: CollectiveEvent) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info(event_line(event, self.rank))
