"""Small tools over a torch.profiler trace's events (:mod:`commdebug.formats.kineto`'s dicts),
for :mod:`commdebug.formats.profiler`: a GPU activity's kind as HolisticTraceAnalysis tells it,
which spans of a thread hold a time, the outermost of nested spans, a span less its holes."""

from __future__ import annotations

import ast
import math
import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["kernel_kind", "KINDS", "as_int", "as_int_list", "ThreadSpans", "span", "outermost", "cut", "Enclosing", "CallsAt"]

# HolisticTraceAnalysis 0.5.0's classification of GPU activities (hta/utils/utils.py)
_COMM_KERNEL = re.compile(r"^nccl.*Kernel")
_MEMORY_KERNEL = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def kernel_kind(name: str) -> str:
    """A GPU activity's kind as HTA 0.5.0 tells it: ``comm``, ``memory``, ``compute`` or ``other``.

    >>> kernel_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    'comm'
    """
    kind = KINDS.get(name)
    if kind is None:
        if _COMM_KERNEL.match(name):
            kind = "comm"
        elif _MEMORY_KERNEL.match(name):
            kind = "memory"
        else:
            kind = "other" if _NOT_COMPUTE.match(name) else "compute"
        if len(KINDS) < 65536:  # a trace has a few hundred distinct kernel names
            KINDS[name] = kind
    return kind


KINDS: dict[str, str] = {}


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def as_int_list(value: Any) -> list[int] | None:
    """``"[0, 1]"`` (how Kineto writes lists in args) or a list, as ints; None when unreadable
    (Kineto cuts long rank lists short with "...")."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


class ThreadSpans:
    """Spans of one kind per thread, merged, for "is this time inside one" (phase, calls)."""

    def __init__(self, spans: Iterable[tuple[Any, float, float]]) -> None:
        by_thread: dict[Any, list[tuple[float, float]]] = defaultdict(list)
        for tid, start, end in spans:
            by_thread[tid].append((start, end))
        self.starts: dict[Any, list[float]] = {}
        self.ends: dict[Any, list[float]] = {}
        for tid, spans_ in by_thread.items():
            merged: list[list[float]] = []
            for s, e in sorted(spans_):
                if merged and s <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            self.starts[tid] = [s for s, _ in merged]
            self.ends[tid] = [e for _, e in merged]

    def covers(self, tid: Any, t: float) -> bool:
        starts = self.starts.get(tid)
        if not starts:
            return False
        i = bisect_right(starts, t) - 1
        return i >= 0 and t <= self.ends[tid][i]


def span(e: dict[str, Any]) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur") or 0.0)


def outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events not inside another of the list on the same thread."""
    out = []
    ends: dict[Any, float] = {}
    for e in sorted(events, key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e.get("dur") or 0.0))):
        start, end = span(e)
        tid = e.get("tid")
        if start < ends.get(tid, -math.inf) and end <= ends[tid]:
            continue
        ends[tid] = end
        out.append(e)
    return out


def cut(whole: tuple[float, float], holes: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``whole`` less the parts ``holes`` cover."""
    pieces = [whole]
    for hs, he in holes:
        if he <= whole[0] or hs >= whole[1]:
            continue
        nxt = []
        for s, e in pieces:
            if he <= s or hs >= e:
                nxt.append((s, e))
                continue
            if hs > s:
                nxt.append((s, hs))
            if he < e:
                nxt.append((he, e))
        pieces = nxt
    return [p for p in pieces if p[1] > p[0]]


class Enclosing:
    """The outermost collective op around a time on a thread (an annotation's c10d op)."""

    def __init__(self, ops: list[dict[str, Any]]) -> None:
        self.by_thread: dict[Any, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
        for e in ops:
            self.by_thread[e.get("tid")].append((*span(e), e))
        for spans in self.by_thread.values():
            spans.sort(key=lambda s: s[0])

    def at(self, tid: Any, t: float) -> dict[str, Any] | None:
        spans = self.by_thread.get(tid) or []
        i = bisect_right([s[0] for s in spans], t) - 1
        return spans[i][2] if i >= 0 and t <= spans[i][1] else None


class CallsAt:
    """Which call's CPU span holds a time on a thread."""

    def __init__(self, spans: list[tuple[Any, float, float, int]]) -> None:
        self.by_thread: dict[Any, tuple[list[float], list[tuple[float, int]]]] = {}
        grouped: dict[Any, list[tuple[float, float, int]]] = defaultdict(list)
        for tid, start, end, i in spans:
            grouped[tid].append((start, end, i))
        for tid, items in grouped.items():
            items.sort()
            self.by_thread[tid] = ([s for s, _, _ in items], [(e, i) for _, e, i in items])

    def find(self, tid: Any, t: float) -> int:
        found = self.by_thread.get(tid)
        if found is None:
            return -1
        starts, rest = found
        j = bisect_right(starts, t) - 1
        while j >= 0:  # calls may nest (a coalesced block): the innermost that holds t
            end, i = rest[j]
            if t <= end:
                return i
            j -= 1
            if j >= 0 and starts[j] < t - 60e6:  # a minute back: nothing holds it
                break
        return -1
