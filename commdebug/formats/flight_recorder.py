"""PyTorch Flight Recorder dumps as commdebug events, so ``commdebug check`` reads them too.

Flight Recorder (torch 2.13) writes, per rank, ``{"version", "pg_config", "pg_status",
"entries": [...]}`` as a pickle (``_dump_fr_trace()``, files ``<prefix><rank>``) or as JSON
(``_dump_fr_trace_json()``, no frames). Each entry has the group as ``process_group: (name,
desc)``, ``collective_seq_id`` / ``p2p_seq_id``, ``profiling_name`` (``gloo:all_reduce``,
``nccl:send 0->1``), input and output sizes and dtypes, ``state``, and ``frames``.

On gloo, ``pg_config`` has one empty name and ranks written as a string, and entries stay
``scheduled``: group names come from the entries, membership from which ranks recorded the
group, and "unfinished" from ``pg_status``'s ``last_completed_collective``. torch's own
analyzer raises ``KeyError`` on such dumps; this reader takes them as they are.

What ``last_completed_collective`` counts differs by backend. gloo counts every op, send and
recv included, though it records no entry for them: it is compared with an entry's ``op_id``
(a barrier after one send has ``collective_seq_id`` 3 and ``op_id`` 4). NCCL counts collectives:
it is compared with ``collective_seq_id``. The JSON form writes these numbers as strings.

An entry that says ``state: completed`` is finished, whatever ``pg_status`` says: NCCL's
``last_completed_collective`` moves only as its watchdog retires work, and a real dump at the end
of an H100 job (tests/data/fr_nccl) said 3 while all 18 of its entries said completed.

gloo marks an op completed on its worker thread, after the caller has been released: a rank
that dumps right after a barrier can still show it unfinished. The reader keeps, per group, the
last sequence number the rank saw completed (``RankView.completed``) so that ``check`` can tell
such a lag from a hang: when any member completed a collective, every member issued it.

Sequence numbers are shifted to ours (0 for a group's first collective; torch counts from 1),
so a Flight Recorder finding and a commdebug finding about the same call name the same number.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.sourcefiles import is_user_file

__all__ = ["from_flight_recorder", "is_flight_recorder", "C10_DTYPES"]

# c10 scalar type names (Flight Recorder's, torch.profiler's "dtype"); ours are torch's (torch.float32 ->
# "float32"), with the bytes of one element
C10_DTYPES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8), "Int": ("int32", 4), "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1),
    "Bool": ("bool", 1), "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
}
_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)")


def is_flight_recorder(data: Any) -> bool:
    """Whether parsed JSON is Flight Recorder's JSON form (told by its keys; ours has a ``fqn``
    root)."""
    return isinstance(data, dict) and "entries" in data and "pg_config" in data


def from_flight_recorder(data: Any, path: Path, rank: int) -> RankView:
    """One rank's Flight Recorder dump (the unpickled or parsed object) as a :class:`RankView`;
    Flight Recorder does not write the rank, so the caller gives it (from the file's name).

    >>> view = from_flight_recorder(fr_dict, Path("fr/fr_trace_0"), 0)  # doctest: +SKIP
    """
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise DumpError(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    try:
        return _view(data, path, rank)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # a field of an unexpected type: say which file, in one line
        raise DumpError(f"{path}: malformed Flight Recorder dump ({type(e).__name__}: {e})") from None


def _view(data: dict[str, Any], path: Path, rank: int) -> RankView:
    groups: dict[str, GroupInfo] = {}
    configs = data.get("pg_config") or {}
    for cfg in configs.values():
        if isinstance(cfg, dict) and cfg.get("name"):
            ranks = _ranks(cfg.get("ranks"))
            groups[str(cfg["name"])] = GroupInfo(str(cfg["name"]), str(cfg.get("desc") or ""), len(ranks or ()), ranks)
    done = {str(k): _count(v.get("last_completed_collective"), "last_completed_collective")
            for k, v in (data.get("pg_status") or {}).items() if isinstance(v, dict)}
    events = []
    completed: dict[str, int] = {}
    for i, entry in enumerate(data["entries"]):
        if isinstance(entry, dict):
            e, finished = _event(i, entry, groups, done)
            events.append(e)
            if finished and e.seq is not None:
                completed[e.group.name] = max(completed.get(e.group.name, -1), e.seq)
    notes = []
    if any(not (cfg or {}).get("name") for cfg in configs.values() if isinstance(cfg, dict)):
        notes.append("pg_config has no group names (as gloo writes it): groups named from the entries, their ranks unknown")
    meta = {"rank": rank, "format": "flight-recorder", "fr_version": data.get("version"), "hostname": None}
    return RankView(rank, path, meta, groups, events, source_format="flight-recorder", notes=notes, completed=completed)


def _count(value: Any, what: str) -> int | None:
    """A counter from pg_status: an int in the pickle, a string in the JSON form."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{what} is {value!r}, not a number")


def _ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(r, int) for r in value):
        return tuple(value)
    return None


def _event(index: int, e: dict[str, Any], groups: dict[str, GroupInfo], done: dict[str, int | None]) -> tuple[CollectiveEvent, bool]:
    """The entry as an event, and whether pg_status says it completed."""
    name = str(e.get("profiling_name") or "")
    kind = name.split(":", 1)[-1].strip()
    peer = None
    m = _P2P.match(kind)
    if m:
        op = m.group(1)
        a, b = int(m.group(2)), int(m.group(3))
        peer = b if op == "send" else a  # "send 0->1": to 1; "recv 0<-1" / "recv 1->0": from the other
    else:
        op = _ops.canonical_op(kind, source="flight_recorder") or kind or "unknown"
    pg = e.get("process_group") or ("", "")
    if not isinstance(pg, (list, tuple)):
        raise TypeError(f"entry {index}: process_group is {pg!r}, not (name, desc)")
    group_name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    if not group_name:
        group_name = f"pg{e.get('pg_id', '?')}"
    group = groups.get(group_name)
    if group is None:
        group = groups[group_name] = GroupInfo(group_name, desc, 0, None)
    in_bytes, in_shapes, dtype = _bytes(e.get("input_sizes"), e.get("input_dtypes"))
    out_bytes, out_shapes, out_dtype = _bytes(e.get("output_sizes"), e.get("output_dtypes"))
    spec = _ops.spec_for_op(op)
    n = group.size or 1
    size = _ops.MESSAGE_SIZE[spec.size](in_bytes, out_bytes, n) if spec else in_bytes
    p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
    seq = None if p2p else _int(e.get("collective_seq_id"))
    finished = _finished(name, e, seq, done.get(str(e.get("pg_id"))))
    in_flight = not finished
    duration = e.get("duration_ms")
    return CollectiveEvent(
        index=index, op=op, key=f"fr:{kind}", aten_op=name, step=0, phase="?", module="?", group=group,
        seq=None if seq is None else seq - 1, dtype=dtype or out_dtype, input_shapes=in_shapes, output_shapes=out_shapes,
        input_bytes=in_bytes, output_bytes=out_bytes, size_bytes=size,
        busbw_factor=spec.busbw_factor(n) if spec else 0.0, source=_source(e.get("frames")),
        latency_s=None if duration is None else float(duration) / 1e3,
        peer=peer, p2p_seq=_int(e.get("p2p_seq_id")) if p2p else None, in_flight=in_flight,
    ), finished


def _finished(name: str, e: dict[str, Any], seq: int | None, last_completed: int | None) -> bool:
    """Whether the entry had completed when the dump was written (see the module docstring)."""
    state = e.get("state")
    if state == "completed" or last_completed is None or seq is None:
        return state in (None, "completed")
    op_id = _int(e.get("op_id"))
    if name.startswith("gloo:") and op_id is not None:
        return op_id <= last_completed  # gloo counts every op, send/recv included
    return seq <= last_completed  # both 1-based, as torch counts


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _bytes(sizes: Any, dtypes: Any) -> tuple[int, tuple[tuple[int, ...], ...], str | None]:
    if not isinstance(sizes, list):
        return 0, (), None
    dtypes = dtypes if isinstance(dtypes, list) else []
    total = 0
    shapes = []
    for i, shape in enumerate(sizes):
        shape = tuple(int(d) for d in shape) if isinstance(shape, list) else ()
        shapes.append(shape)
        total += math.prod(shape) * C10_DTYPES.get(str(dtypes[i]) if i < len(dtypes) else "", ("", 0))[1]
    first = str(dtypes[0]) if dtypes else None
    return total, tuple(shapes), C10_DTYPES[first][0] if first in C10_DTYPES else first


def _source(frames: Any) -> str | None:
    """The innermost frame of the user's code (frames are innermost first), as ``file:line``."""
    for f in frames or []:
        if isinstance(f, dict) and is_user_file(str(f.get("filename") or "")):
            return f"{f.get('filename')}:{f.get('line')}"
    return None
