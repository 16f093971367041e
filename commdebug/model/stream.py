"""The stream: one rank's recording as it runs, appended to ``rank<R>.jsonl`` (docs/streaming.md,
format in docs/json-format.md, stream version :data:`STREAM_VERSION`).

JSON lines, each one self-contained, so that a process killed at any moment leaves a file that
reads up to its last whole line:

- a ``header`` line first: ``{"commdebug_stream": 1, "kind": "header", "schema_version": 2,
  "metadata": {...}, "time": ...}``;
- ``chunk`` lines: the events recorded since the previous chunk (the dump's by-column
  ``events`` block, with its own string table), the groups they name, the step the rank is in,
  the wall time, and the metadata when it changed. An event written again later (its time
  arrived, it finished or failed) has its index again: the later line wins;
- at most one ``older`` line, after the header: totals of the events no longer kept one by one
  (``keep_steps``), see :class:`~commdebug.model.aggregates.Aggregates`;
- ``issued`` lines: one event each, written as its collective is issued, before any wait and
  before the chunk that will hold it, so that a process killed right after issuing a call
  (SIGKILL, a native abort inside the collective) leaves it. A row of fields
  (:func:`~commdebug.model.events.event_row`), and the group's members the first time the file
  names the group. A chunk's version of an event always wins over an ``issued`` one.

Readers (:mod:`commdebug.formats.readers`) take a torn last line as the end of the stream and
say so in one note; a bad line anywhere else is a malformed file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from commdebug.errors import DumpError
from commdebug.model.aggregates import Aggregates, set_older
from commdebug.model.events import (
    _SHAPES,
    _TEXT,
    EVEN,
    FIELDS,
    SPLITS,
    decode_events,
    encode_events,
    event_row,
    row_event,
)
from commdebug.model.rank_view import RankView
from commdebug.model.trace import GLOBAL, CollectiveEvent, GroupInfo, Trace

__all__ = ["STREAM_VERSION", "STREAM_SUFFIX", "is_stream", "header_line", "chunk_line", "older_line", "issued_line",
           "StreamContent", "parse_stream", "stream_trace", "stream_rank_view"]

STREAM_VERSION = 1
_INDEXED = _TEXT | _SHAPES  # columns of string-table indices
_REQUIRED = frozenset({"index", "op", "size_bytes"})
STREAM_SUFFIX = ".jsonl"
_MAGIC = b'{"commdebug_stream":'


def is_stream(raw: bytes) -> bool:
    """True when ``raw`` starts like a stream's header line."""
    return raw[:256].lstrip()[: len(_MAGIC)].replace(b" ", b"") == _MAGIC.replace(b" ", b"")


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def header_line(metadata: dict[str, Any], schema_version: int, time: float) -> str:
    """The stream's first line."""
    return _line({"commdebug_stream": STREAM_VERSION, "kind": "header", "schema_version": schema_version,
                  "metadata": metadata, "time": time})


def chunk_line(events: list[CollectiveEvent], *, time: float, step: int, events_total: int,
               metadata: dict[str, Any] | None = None, progress: float | None = None,
               in_flight: list[tuple[int, float]] | None = None) -> str:
    """One chunk: ``events`` with the groups they name; ``metadata`` when it changed;
    ``progress``, the wall time of the rank's last new event or step; ``in_flight``, the
    (index, wall time since) of the collectives unfinished for a while."""
    groups: dict[str, GroupInfo] = {}
    for e in events:
        groups.setdefault(e.group.name, e.group)
    chunk: dict[str, Any] = {"kind": "chunk", "time": time, "step": step, "events_total": events_total,
                             "groups": {name: g.to_dict() for name, g in groups.items()}, "events": encode_events(events)}
    if metadata is not None:
        chunk["metadata"] = metadata
    if progress is not None:
        chunk["progress"] = progress
    if in_flight:
        chunk["in_flight"] = [list(pair) for pair in in_flight]
    return _line(chunk)


_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _row_encoder() -> Callable[[list[Any]], str]:
    """JSON of an event row, as _ENCODE writes it: the C encoder made once (JSONEncoder.encode
    makes one per call), where this Python has it. An issued line is written per collective."""
    from json import encoder

    make = getattr(encoder, "c_make_encoder", None)  # not in the standard library's stubs
    if make is None:
        return _ENCODE

    def unknown(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    chunks = make(None, unknown, encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda row: "".join(chunks(row, 0))


_ENCODE_ROW = _row_encoder()


def issued_line(event: CollectiveEvent, time: float, group: GroupInfo | None = None) -> str:
    """One event as its collective is issued (see the module docstring); ``group``: the
    event's group, the first time this file names it."""
    # the wall time as json writes a finite float (its repr), without an encoder's setup
    head = '{"kind":"issued","time":' + (float.__repr__(float(time)) if math.isfinite(time) else _ENCODE(time))
    if group is not None:
        head += ',"groups":' + _ENCODE({group.name: group.to_dict()})
    return head + ',"event":' + _ENCODE_ROW(event_row(event)) + "}\n"


def older_line(older: Aggregates, kept_from_step: int) -> str:
    """Totals of the events no longer kept one by one; raw events are kept from ``kept_from_step``."""
    return _line({"kind": "older", "kept_from_step": kept_from_step, "older": older.to_dict()})


@dataclass
class StreamContent:
    """What a stream holds, as read: the latest metadata, the groups, the events (each index
    once, its latest line), the older totals, and how the stream ends."""

    metadata: dict[str, Any]
    groups: dict[str, GroupInfo]
    events: list[CollectiveEvent]
    older: Aggregates | None = None
    chunks: int = 0
    step: int = 0  # the step the rank was in at its last chunk
    time: float | None = None  # wall time of its last chunk
    progress: float | None = None  # wall time of its last new event or step
    in_flight: dict[int, float] = field(default_factory=dict)  # index -> wall time it has been unfinished since
    events_total: int = 0
    torn: bool = False
    notes: list[str] = field(default_factory=list)


def parse_stream(raw: bytes, source: str) -> StreamContent:
    """Read a stream's bytes; a :class:`DumpError` naming ``source`` when it is malformed
    before its last line (a torn last line is a note, see the module docstring)."""
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a whole line
    torn = bool(tail.strip(b"\x00 \t\r"))
    content: StreamContent | None = None
    merged = _Merged()
    issued: list[tuple[int, Any]] = []  # (line number, event row) of the issued lines
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError as e:
            if number == len(lines) and not torn:  # the last whole line, cut by a crash after its newline was counted
                torn = True
                break
            raise DumpError(f"{source}: line {number} of the stream is not valid JSON ({e})") from None
        kind = obj.get("kind")
        if content is None:
            if kind != "header" or obj.get("commdebug_stream") != STREAM_VERSION:
                version = obj.get("commdebug_stream")
                raise DumpError(f"{source}: stream version {version!r} is not supported (this commdebug reads stream version "
                                f"{STREAM_VERSION}; upgrade commdebug)")
            content = StreamContent(dict(obj.get("metadata") or {}), {}, [], time=obj.get("time"))
            continue
        try:
            if kind in ("chunk", "issued"):
                for name, g in (obj.get("groups") or {}).items():
                    if str(name) not in content.groups:  # a group never changes: read it once
                        content.groups[str(name)] = GroupInfo.from_dict(name, g)
            if kind == "issued":
                issued.append((number, obj["event"]))
                when = obj.get("time")
                if isinstance(when, (int, float)):  # the rank was alive and issued a new call then
                    content.time = max(content.time or when, when)
                    content.progress = max(content.progress or when, when)
            elif kind == "chunk":
                merged.add(obj["events"], f"{source} line {number}")
                if obj.get("metadata") is not None:
                    content.metadata = dict(obj["metadata"])
                content.chunks += 1
                content.step = int(obj.get("step", content.step))
                content.time = obj.get("time", content.time)
                content.events_total = int(obj.get("events_total", content.events_total))
                content.progress = obj.get("progress", content.progress)
                content.in_flight = {int(i): float(t) for i, t in obj.get("in_flight") or ()}
            elif kind == "older":
                content.older = Aggregates.from_dict(obj["older"])
                # events of the steps folded in are not kept one by one any more
                merged = _Merged()
                issued.clear()
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DumpError(f"{source}: line {number} of the stream is malformed ({type(e).__name__}: {e})") from None
    if content is None:
        raise DumpError(f"{source}: an empty stream (its process wrote nothing into it: it ended, or had not started "
                        "recording, when the file was read)")
    events = decode_events(merged.block(), content.groups, source)
    indices = merged.columns["index"]
    if any(a >= b for a, b in pairwise(indices)):  # an event written again: its later line wins
        by_index = {e.index: e for e in events}
        events = sorted(by_index.values(), key=lambda e: e.index)
    if issued:
        events = _with_issued(events, issued, content, source)
    content.events = events
    if torn:
        content.torn = True
        content.notes.append("its stream's last chunk was cut short (its process ended while writing it): "
                             "read up to it")
    return content


def _with_issued(events: list[CollectiveEvent], issued: list[tuple[int, Any]], content: StreamContent,
                 source: str) -> list[CollectiveEvent]:
    """``events`` (from chunks) and the issued lines' events that no chunk holds: the calls a
    process issued after its last chunk, which a kill would otherwise have taken with it."""
    chunked = {e.index for e in events}
    extra: dict[int, CollectiveEvent] = {}
    for number, row in issued:
        try:
            event = row_event(row, content.groups)
        except (TypeError, ValueError) as e:
            raise DumpError(f"{source}: line {number} of the stream is malformed ({type(e).__name__}: {e})") from None
        if event.index not in chunked:
            extra[event.index] = event
    if not extra:
        return events
    last = max(extra.values(), key=lambda e: e.index)
    content.events_total = max(content.events_total, last.index + 1)
    content.step = max(content.step, last.step)
    return sorted([*events, *extra.values()], key=lambda e: e.index)


class _Merged:
    """The chunks' event blocks as one, their string tables merged: one decode for the whole
    stream instead of one per chunk (a stream of a long run has thousands of small chunks)."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.ids: dict[str, int] = {}
        self.columns: dict[str, list] = {name: [] for name in FIELDS}
        self.count = 0
        self.splits: list[Any] = []  # the chunks' split tables as one (see events.py)
        self.split_ids: dict[tuple, int] = {}

    def add(self, block: Any, where: str) -> None:
        if not isinstance(block, dict) or not isinstance(block.get("columns"), dict) or not isinstance(block.get("strings"), list):
            raise DumpError(f"{where}: malformed events (expected 'count', 'strings' and 'columns')")
        n = int(block.get("count", 0))
        remap: dict[Any, int | None] = {None: None}
        for i, text in enumerate(block["strings"]):
            g = self.ids.get(text)
            if g is None:
                g = self.ids[text] = len(self.strings)
                self.strings.append(text)
            remap[i] = g
        columns = block["columns"]
        split_remap: dict[Any, Any] = {None: None, EVEN: EVEN}
        for i, packed in enumerate(block.get("splits") or ()):
            key = tuple(packed)
            g = self.split_ids.get(key)
            if g is None:
                g = self.split_ids[key] = len(self.splits)
                self.splits.append(packed)
            split_remap[i] = g
        for name in FIELDS:
            values = columns.get(name)
            if values is None:
                if name in _REQUIRED:
                    raise DumpError(f"{where}: malformed events (no column {name!r})")
                values = [CollectiveEvent._field_defaults.get(name)] * n
            elif len(values) != n:
                raise DumpError(f"{where}: malformed events (column {name!r} has {len(values)} values, not {n})")
            elif name in _INDEXED:
                try:
                    values = list(map(remap.__getitem__, values))
                except (KeyError, TypeError):
                    raise DumpError(f"{where}: malformed events (a string index of column {name!r} is not in the string table)") from None
            elif name in SPLITS:
                try:
                    values = list(map(split_remap.__getitem__, values))
                except (KeyError, TypeError):
                    raise DumpError(f"{where}: malformed events (a value of column {name!r} is not in the splits table)") from None
            self.columns[name].extend(values)
        self.count += n

    def block(self) -> dict[str, Any]:
        return {"count": self.count, "strings": self.strings, "columns": self.columns, "splits": self.splits}


def _module_path(fqn: str) -> list[str]:
    """Global and the module's ancestors by name (``a.b.c``: ``a``, ``a.b``, ``a.b.c``)."""
    if fqn == GLOBAL or not fqn:
        return [GLOBAL]
    parts = fqn.split(".")
    return [GLOBAL] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def stream_trace(content: StreamContent) -> Trace:
    """A :class:`Trace` of a stream: its events, groups and metadata (with ``metadata.stream``,
    as :func:`stream_rank_view` gives), and a module tree made from the modules' names (a stream
    carries no tree), counting the older totals too."""
    trace = Trace(max_events=None)
    for g in content.groups.values():
        trace.add_group(g)
    trace.metadata = dict(content.metadata)
    trace.metadata["stream"] = _stream_facts(content)
    trace.metadata.setdefault("steps", 0)
    if content.notes:
        trace.metadata["read_notes"] = list(content.notes)

    def count(module: str, phase: str, key: str, op: str, group: str, nbytes: int | None, n: int) -> None:
        path = _module_path(module)
        for parent, fqn in zip([None, *path[:-1]], path, strict=True):
            if fqn != GLOBAL:
                trace.add_module(fqn, parent)
        trace.add_collective(path, phase, (key, op, group), nbytes, n)

    if content.older is not None:
        for (module, phase, key, op, group, size), row in content.older.rows.items():
            count(module, phase, key, op, group, None if size is None else row[1], row[0])
    for e in content.events:
        trace.add_group(e.group)
        count(e.module, e.phase, e.key, e.op, e.group.name, e.size_bytes, 1)
    trace.events.extend(content.events)
    older = content.older.events if content.older is not None else 0
    trace.events_total = max(content.events_total, len(content.events) + older)
    trace.step = max(content.step, int(trace.metadata.get("steps", 0) or 0))
    trace.metadata["steps"] = trace.steps
    set_older(trace, content.older)
    return trace


def _stream_facts(content: StreamContent) -> dict[str, Any]:
    """What both readings of a stream put in ``metadata.stream``: how far it got, how it ends."""
    return {"chunks": content.chunks, "step": content.step, "time": content.time, "progress": content.progress,
            "in_flight": {str(i): t for i, t in content.in_flight.items()}, "torn": content.torn}


def stream_rank_view(content: StreamContent, path: Path, rank_from_name: Callable[[], int]) -> RankView:
    """One rank's :class:`RankView` of a stream; a rank whose stream has no ending says so in
    ``metadata.ended_by``'s absence and ``metadata.stream``."""
    meta = dict(content.metadata)
    meta["stream"] = _stream_facts(content)
    rank = meta.get("rank")
    view = RankView(int(rank) if isinstance(rank, int) else rank_from_name(), path, meta, dict(content.groups), content.events)
    view.notes.extend(content.notes)
    set_older(view, content.older)
    return view


def older_events(events: Iterable[CollectiveEvent]) -> Aggregates:
    """Totals of ``events`` (a helper for writers folding events away)."""
    agg = Aggregates()
    agg.add_all(events)
    return agg
