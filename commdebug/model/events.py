"""Events in the JSON dump, by column: each field is one JSON array, and repeated text (ops,
modules, sources, groups, shapes) is stored once in a string table and referred to by index.

A 10,000-event dump of a tensor-parallel transformer takes 0.97 MB this way against 5.7 MB as
one object per event, and parses at about 700k events/s instead of 47k: what makes reading a
folder of a thousand ranks' dumps fast (docs/json-format.md, bench/ranks_scale.py).

    "events": {"count": 2, "strings": ["all_reduce", "Global", "[[4, 8]]", ...],
               "columns": {"index": [0, 1], "op": [0, 0], "module": [1, 1], ...}}

Text columns hold string-table indices (or null); shapes are text (their JSON) in the table.

An all_to_all's bytes per member (``send_splits``, ``recv_splits``) are columns only in a block
with such events: null (none), -1 (even: the event's input or output bytes over its group's
size), or an index into the block's ``splits`` table, where each distinct vector is stored once
as ``[unit, k0, k1, ...]``: member i's bytes are ``unit * ki`` (unit, the vector's greatest
common divisor, is a token's bytes in an MoE layer, so the counts stay short).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import partial
from math import gcd
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.model.trace import UNKNOWN_GROUP, CollectiveEvent, GroupInfo

__all__ = ["encode_events", "decode_events", "event_row", "row_event", "FIELDS", "SPLITS", "EVEN", "pack_splits", "unpack_splits"]

FIELDS = CollectiveEvent._fields
# fields stored as string-table indices; the shapes as their JSON text
_TEXT = frozenset({"op", "key", "aten_op", "phase", "module", "group", "dtype", "dtensor_op", "placements", "mesh", "source", "error", "unit"})
_SHAPES = frozenset({"input_shapes", "output_shapes"})
# all_to_all's bytes per member, and the bytes each side splits evenly when marked EVEN
SPLITS = {"send_splits": "input_bytes", "recv_splits": "output_bytes"}
EVEN = -1
_TOTAL = {name: FIELDS.index(total) for name, total in SPLITS.items()}


def pack_splits(splits: tuple[int, ...]) -> list[int]:
    """A split vector as the ``splits`` table stores it: ``[unit, k0, k1, ...]``.

    >>> pack_splits((8192, 0, 24576))
    [8192, 1, 0, 3]
    """
    unit = gcd(*splits) or 1
    return [unit, *(v // unit for v in splits)]


def unpack_splits(packed: Any) -> tuple[int, ...]:
    """What :func:`pack_splits` stored, as bytes per member."""
    unit = int(packed[0])
    return tuple(int(k) * unit for k in packed[1:])


def _is_even(splits: tuple[int, ...], total: int | None, n: int) -> bool:
    return total is not None and n > 0 and len(splits) == n and splits[0] * n == total and splits.count(splits[0]) == n


def encode_events(events: Iterable[CollectiveEvent]) -> dict[str, Any]:
    """The dump's ``events`` block for ``events`` (in order)."""
    strings: list[str] = []
    ids: dict[str, int] = {}

    def ref(text: str | None) -> int | None:
        if text is None:
            return None
        i = ids.get(text)
        if i is None:
            i = ids[text] = len(strings)
            strings.append(text)
        return i

    shape_text: dict[tuple, int | None] = {}
    split_ids: dict[tuple[int, ...], int] = {}
    table: list[list[int]] = []
    columns: dict[str, list] = {name: [] for name in FIELDS}
    count = 0
    has_splits = False
    for e in events:
        count += 1
        fields: tuple[Any, ...] = e  # each field's type goes with its name, dispatched on below
        for name, value in zip(FIELDS, fields, strict=True):
            if name == "group":
                value = ref(value.name)
            elif name in _TEXT:
                value = ref(value)
            elif name in _SHAPES:
                i = shape_text.get(value)
                if i is None:
                    i = shape_text[value] = ref(json.dumps([list(s) for s in value], separators=(",", ":")))
                value = i
            elif name in SPLITS and value is not None:
                has_splits = True
                if _is_even(value, fields[_TOTAL[name]], e.group.size):
                    value = EVEN
                else:
                    i = split_ids.get(value)
                    if i is None:
                        i = split_ids[value] = len(table)
                        table.append(pack_splits(value))
                    value = i
            columns[name].append(value)
    block: dict[str, Any] = {"count": count, "strings": strings, "columns": columns}
    if table:
        block["splits"] = table
    if not has_splits:
        for name in SPLITS:  # no all_to_all here: the columns cost nothing (absent reads as null)
            del columns[name]
    return block


def decode_events(block: Any, groups: dict[str, GroupInfo], source: str = "<dump>") -> list[CollectiveEvent]:
    """Events from an ``events`` block written by :func:`encode_events`."""
    if not isinstance(block, dict) or not isinstance(block.get("columns"), dict) or not isinstance(block.get("strings"), list):
        raise DumpError(f"{source}: malformed events (expected 'count', 'strings' and 'columns')")
    strings = block["strings"]
    columns = block["columns"]
    count = int(block.get("count", 0))
    missing = [name for name in ("index", "op", "size_bytes") if name not in columns]
    if missing:
        raise DumpError(f"{source}: malformed events (no column {missing[0]!r})")
    # Columns hold few distinct values (string-table indices): each is decoded once, then the
    # column is mapped through a dict in C; a negative or missing index is a KeyError.
    texts: dict[Any, str | None] = dict(enumerate(strings))
    texts[None] = None

    def shape(i: Any) -> tuple:
        text = texts[i]
        return () if text is None else tuple(tuple(s) for s in json.loads(text))

    def group(i: Any) -> GroupInfo:
        name = texts[i]
        return UNKNOWN_GROUP if name is None else groups.get(name) or GroupInfo(name, "", 0, None)

    table = block.get("splits") or []
    vectors = [unpack_splits(packed) for packed in table]

    def column(name: str, decode: Any = None) -> list:
        values: list[Any] | None = columns.get(name)
        if values is None:  # a field added after the dump was written: its default
            return [CollectiveEvent._field_defaults.get(name)] * count
        if len(values) != count:
            raise DumpError(f"{source}: malformed events (column {name!r} has {len(values)} values, not {count})")
        if decode is None:
            return values
        table = texts if decode is True else {i: decode(i) for i in set(values)}
        return list(map(table.__getitem__, values))

    decoded = []
    try:
        for name in FIELDS:
            if name == "group":
                decoded.append(column(name, group))
            elif name in _TEXT:
                decoded.append(column(name, True))
            elif name in _SHAPES:
                decoded.append(column(name, shape))
            elif name in SPLITS and name in columns:
                decoded.append(_splits_column(column(name), vectors, decoded[FIELDS.index(SPLITS[name])], decoded[FIELDS.index("group")]))
            else:
                decoded.append(column(name))
        # tuple.__new__ straight from C: zip's rows have exactly one value per field
        return list(map(partial(tuple.__new__, CollectiveEvent), zip(*decoded, strict=True)))
    except KeyError as e:
        raise DumpError(f"{source}: malformed events (string index {e.args[0]!r} is not in the string table)") from None
    except (IndexError, TypeError, ValueError) as e:
        raise DumpError(f"{source}: malformed events ({type(e).__name__}: {e})") from None


_GROUP = FIELDS.index("group")
_SHAPE_AT = tuple(FIELDS.index(name) for name in sorted(_SHAPES))
_SPLIT_AT = tuple(FIELDS.index(name) for name in SPLITS)


def event_row(event: CollectiveEvent) -> list[Any]:
    """One event as a JSON-ready row: its fields in :data:`FIELDS` order, the group by name (a
    stream says each group's members once). For a single event, where a block's string table
    buys nothing: the stream's ``issued`` lines (model/stream.py).

    >>> event_row(event)[:3]   # doctest: +SKIP
    [7, 'all_to_all', 'c10d.alltoall_base_']
    """
    row = list(event)
    row[_GROUP] = event.group.name
    return row


def row_event(row: Any, groups: dict[str, GroupInfo]) -> CollectiveEvent:
    """The event :func:`event_row` wrote (fields added since then take their defaults); a
    ``ValueError`` when the row is malformed."""
    if not isinstance(row, list) or not 3 <= len(row) <= len(FIELDS) or not isinstance(row[0], int):
        raise ValueError("an event row must be a list of its fields, the index first")
    values = row + [CollectiveEvent._field_defaults.get(name) for name in FIELDS[len(row):]]
    name = values[_GROUP]
    values[_GROUP] = UNKNOWN_GROUP if name is None else groups.get(str(name)) or GroupInfo(str(name), "", 0, None)
    for i in _SHAPE_AT:
        values[i] = tuple(tuple(int(d) for d in s) for s in values[i] or ())
    for i in _SPLIT_AT:
        if values[i] is not None:
            values[i] = tuple(int(v) for v in values[i])
    return tuple.__new__(CollectiveEvent, values)


def _splits_column(values: list, vectors: list[tuple[int, ...]], totals: list, groups: list[GroupInfo]) -> list:
    """A split column's values as tuples: EVEN from the event's bytes and group size, an index
    from the table (the same tuple object for every event that shares it)."""
    out: list[tuple[int, ...] | None] = []
    for value, total, group in zip(values, totals, groups, strict=True):
        if value is None:
            out.append(None)
        elif value == EVEN:
            n = group.size
            out.append(_ops.even_splits(total, n) if n > 0 and total is not None else None)
        else:
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"split index {value!r}")
            out.append(vectors[value])
    return out
