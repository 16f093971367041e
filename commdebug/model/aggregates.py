"""What is left of events no longer kept one by one: counts, bytes and times per (module, phase,
op, group, message size) and per step. A long run with ``keep_steps`` keeps raw events for its
last steps only; these totals cover the rest, so that ``summary`` still adds up the whole run.

Stored in a dump as ``commdebug.older`` and in a stream as its ``older`` line
(docs/json-format.md). Exact sizes are kept (a run has few distinct sizes); percentiles of the
per-call bandwidth are not (they come from the kept events only).

>>> agg = Aggregates()
>>> agg.add(event)                      # doctest: +SKIP
>>> agg.events, agg.bytes               # doctest: +SKIP
(1, 4096)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from commdebug.model.trace import CollectiveEvent

__all__ = ["Aggregates", "older_of", "set_older"]

# per key: calls, bytes, timed calls, seconds, timed bytes, bus bytes (bytes x factor, timed), min s, max s
_ROW = 8
_KEY = 6  # module, phase, reference key, op, group name, size


class Aggregates:
    """Running totals of collective events, per line and per step (see the module docstring)."""

    __slots__ = ("rows", "steps", "events")

    def __init__(self) -> None:
        # (module, phase, key, op, group name, size bytes) -> [calls, bytes, timed, time_s, timed_bytes, bus_bytes, min_s, max_s];
        # a size not known is None in the key and adds nothing to the bytes (its row's calls say how many)
        self.rows: dict[tuple[str, str, str, str, str, int | None], list] = {}
        # step -> [calls, bytes, timed, time_s]
        self.steps: dict[int, list] = {}
        self.events = 0

    @property
    def bytes(self) -> int:
        """Message bytes (S) of every event folded in."""
        return sum(r[1] for r in self.rows.values())

    @property
    def time_s(self) -> float | None:
        """Seconds of the timed events folded in, None when none was timed."""
        timed = [r[3] for r in self.rows.values() if r[2]]
        return sum(timed) if timed else None

    def add(self, e: CollectiveEvent) -> None:
        """Fold one event in."""
        self.events += 1
        key = (e.module, e.phase, e.key, e.op, e.group.name, e.size_bytes)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0, 0, 0, 0.0, 0, 0.0, None, None]
        size = e.size_bytes or 0  # None (not known) counts in the row's calls, not in its bytes
        row[0] += 1
        row[1] += size
        step = self.steps.get(e.step)
        if step is None:
            step = self.steps[e.step] = [0, 0, 0, 0.0]
        step[0] += 1
        step[1] += size
        t = e.latency_s
        if t is not None:
            row[2] += 1
            row[3] += t
            row[4] += size
            row[5] += size * (e.busbw_factor or 0.0)
            row[6] = t if row[6] is None or t < row[6] else row[6]
            row[7] = t if row[7] is None or t > row[7] else row[7]
            step[2] += 1
            step[3] += t

    def add_all(self, events: Iterable[CollectiveEvent]) -> None:
        for e in events:
            self.add(e)

    def merge(self, other: Aggregates) -> None:
        """Add another set of totals to these."""
        self.events += other.events
        for key, r in other.rows.items():
            mine = self.rows.get(key)
            if mine is None:
                self.rows[key] = list(r)
                continue
            for i in range(6):
                mine[i] += r[i]
            if r[6] is not None:
                mine[6] = r[6] if mine[6] is None else min(mine[6], r[6])
                mine[7] = r[7] if mine[7] is None else max(mine[7], r[7])
        for step, s in other.steps.items():
            mine = self.steps.setdefault(step, [0, 0, 0, 0.0])
            for i in range(4):
                mine[i] += s[i]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"events", "rows": [[module, phase, key, op, group, size, calls, ...]], "steps": [[step, ...]]}``."""
        return {"events": self.events,
                "rows": [[*key, *row] for key, row in self.rows.items()],
                "steps": [[step, *s] for step, s in sorted(self.steps.items())]}

    @classmethod
    def from_dict(cls, d: Any) -> Aggregates:
        """Totals from :meth:`to_dict`'s form; a ``ValueError``/``TypeError``/``KeyError`` when malformed."""
        agg = cls()
        agg.events = int(d["events"])
        for row in d.get("rows") or []:
            if len(row) != _KEY + _ROW:
                raise ValueError(f"an older-events row has {len(row)} values, not {_KEY + _ROW}")
            module, phase, key, op, group, size = row[:_KEY]
            values = row[_KEY:]
            agg.rows[(str(module), str(phase), str(key), str(op), str(group), None if size is None else int(size))] = [
                int(values[0]), int(values[1]), int(values[2]), float(values[3]), int(values[4]), float(values[5]), values[6], values[7]]
        for row in d.get("steps") or []:
            step, calls, nbytes, timed, seconds = row
            agg.steps[int(step)] = [int(calls), int(nbytes), int(timed), float(seconds)]
        return agg


_ATTRIBUTE = "older_events"


def older_of(trace: Any) -> Aggregates | None:
    """The totals of a trace's (or rank view's) events that are no longer kept one by one, if any."""
    return getattr(trace, _ATTRIBUTE, None)


def set_older(trace: Any, older: Aggregates | None) -> None:
    """Attach the totals of events no longer kept to a trace read from a file."""
    setattr(trace, _ATTRIBUTE, older)
