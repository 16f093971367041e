"""Exposed time split into waiting and transfer (``commdebug overlap``'s ``exposed_wait_s`` and
``exposed_transfer_s``): how much of a rank's exposed communication was the rank waiting for a
peer to arrive, which better overlap cannot remove, and how much the data moving.

A collective's members all take about the same time to move its data once every one of them is
in; a member that came early also waits for the last. So, with each call's length on every
member of its group known (a joined profile on every rank: our own runs with ``--profile-steps``,
or a folder of traces that name their groups and sequence numbers), a member's *wait* in a call
is its length there minus the least length any member took, placed at the start of its span (the
member that came early waits first, then moves the data with the others). The part of that wait
that was exposed (no compute under it, shared with the other collectives running at that
instant, as the exposed time itself is) is ``exposed_wait_s``; the rest of the exposed time is
``exposed_transfer_s``. Where some member's length of a call is not known (one trace alone, gloo
traces that name no group, a call at the edge of one rank's profile), the split of the exposed
time that call holds is not known: None.

Each rank keeps what the split needs until every rank is read (:class:`WaitInputs`: per call its
key, start and length; per row of figures, the exposed pieces of each of its calls), small flat
arrays: the least lengths are over ranks, so the split is made when the ranks are merged.

    >>> least = least_lengths(i.calls for i in inputs)            # doctest: +SKIP
    >>> total, rows = split(inputs[0], least)                     # doctest: +SKIP
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CallKey", "CallTimes", "Pieces", "WaitInputs", "least_lengths", "split"]

CallKey = tuple[str, int]  # (group name, sequence number): one collective, on every member


@dataclass
class CallTimes:
    """One rank's profiled calls, by the profile's index of each (its ``ref``): its key (None:
    not known: the trace names no group or number), its group's size, and its span's start and
    length in microseconds, as the sweep measures them (rounded with ``--round-us``)."""

    keys: list[CallKey | None] = field(default_factory=list)
    sizes: array = field(default_factory=lambda: array("i"))
    start: array = field(default_factory=lambda: array("d"))
    length: array = field(default_factory=lambda: array("d"))


class Pieces(dict[int, list[float]]):
    """Per call (ref), the exposed instants of its activities in one sweep, as flat ``t0, t1,
    weight`` triples in time order (weight: its share of the instant, 1/n of n collectives
    running then with no compute); touching pieces of one weight are one."""

    def add(self, ref: int, t0: float, t1: float, weight: float) -> None:
        mine = self.get(ref)
        if mine is None:
            self[ref] = [t0, t1, weight]
        elif mine[-2] == t0 and mine[-1] == weight:
            mine[-2] = t1
        else:
            mine += (t0, t1, weight)


@dataclass
class WaitInputs:
    """What one rank's figures need to be split once every rank's calls are known: its calls,
    the exposed pieces of each in its whole-rank sweep (``total``), and per row of figures, in
    the rows' order, the pieces of that row's calls (a step row's from the step's own sweep)."""

    calls: CallTimes
    total: Pieces
    rows: list[Pieces]


def least_lengths(calls: Iterable[CallTimes]) -> dict[CallKey, tuple[float, int, int]]:
    """Per call key, over every rank that has it: (the least length, how many ranks have it, its
    group's size)."""
    out: dict[CallKey, tuple[float, int, int]] = {}
    for c in calls:
        for key, size, length in zip(c.keys, c.sizes, c.length, strict=True):
            if key is None:
                continue
            had = out.get(key)
            out[key] = (length, 1, size) if had is None else (min(had[0], length), had[1] + 1, max(had[2], size))
    return out


def _waited(pieces: list[float], start: float, wait: float) -> float:
    """The exposed part of [start, start + wait] in a call's pieces, each piece weighted."""
    end = start + wait
    total = 0.0
    for k in range(0, len(pieces), 3):
        lo, hi = max(pieces[k], start), min(pieces[k + 1], end)
        if hi > lo:
            total += (hi - lo) * pieces[k + 2]
        elif pieces[k] >= end:
            break
    return total


def _split_pieces(pieces: Pieces, calls: CallTimes, least: dict[CallKey, tuple[float, int, int]]) -> float | None:
    """The exposed waiting (µs) in `pieces`; None where a call with exposed time there has a
    length not known on some member of its group (or is tied to no call)."""
    total = 0.0
    for ref, mine in pieces.items():
        key = calls.keys[ref] if 0 <= ref < len(calls.keys) else None
        seen = least.get(key) if key is not None else None
        if seen is None or seen[2] < 1 or seen[1] < seen[2]:
            return None
        wait = calls.length[ref] - seen[0]
        if wait > 0:
            total += _waited(mine, calls.start[ref], wait)
    return total


def split(inputs: WaitInputs, least: dict[CallKey, tuple[float, int, int]]) -> tuple[float | None, list[float | None]]:
    """The exposed waiting of a rank, in seconds: over its whole-rank figures and per row (the
    rows' order); None where it is not known (see the module docstring)."""
    total = _split_pieces(inputs.total, inputs.calls, least)
    rows = [_split_pieces(p, inputs.calls, least) for p in inputs.rows]
    return (None if total is None else total / 1e6), [None if r is None else r / 1e6 for r in rows]
