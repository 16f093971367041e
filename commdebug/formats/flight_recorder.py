"""PyTorch Flight Recorder dumps as commdebug events, so ``commdebug check`` reads them too.

Flight Recorder (torch 2.13) writes, per rank, ``{"version", "pg_config", "pg_status",
"entries": [...]}`` as a pickle (``_dump_fr_trace()``, files ``<prefix><rank>``) or as JSON
(``_dump_fr_trace_json()``, no frames). Each entry has the group as ``process_group: (name,
desc)``, ``collective_seq_id`` / ``p2p_seq_id``, ``profiling_name`` (``gloo:all_reduce``,
``nccl:send 0->1``), input and output sizes and dtypes, ``state``, and ``frames``.

On gloo, ``pg_config`` has one empty name and ranks written as a string, and entries stay
``scheduled``: group names come from the entries, membership from which ranks recorded the
group, and "unfinished" from ``pg_status``'s last completed sequence number. torch's own
analyzer raises ``KeyError`` on such dumps; this reader takes them as they are.

Sequence numbers are shifted to ours (0 for a group's first collective; torch counts from 1),
so a Flight Recorder finding and a commdebug finding about the same call name the same number.
"""

from __future__ import annotations

import ast
import math
import os
import re
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.model.ranks import RankView, _rank_from_name
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.sourcefiles import is_user_file

__all__ = ["from_flight_recorder"]

# Flight Recorder writes c10 scalar type names; ours are torch's (torch.float32 -> "float32")
_DTYPES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8), "Int": ("int32", 4), "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1),
    "Bool": ("bool", 1), "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
}
_OP_NAMES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "send": "send", "recv": "recv", "barrier": "barrier",
}
_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)")


def from_flight_recorder(data: Any, path: Path) -> RankView:
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise DumpError(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    rank = _rank_from_name(path)
    groups: dict[str, GroupInfo] = {}
    for key, cfg in (data.get("pg_config") or {}).items():
        if isinstance(cfg, dict) and cfg.get("name"):
            ranks = _ranks(cfg.get("ranks"))
            groups[str(cfg["name"])] = GroupInfo(str(cfg["name"]), str(cfg.get("desc") or ""), len(ranks or ()), ranks)
    done = {str(k): v.get("last_completed_collective", -1) for k, v in (data.get("pg_status") or {}).items() if isinstance(v, dict)}
    events = []
    for i, entry in enumerate(data["entries"]):
        if isinstance(entry, dict):
            events.append(_event(i, entry, groups, done))
    notes = []
    if any(not (cfg or {}).get("name") for cfg in (data.get("pg_config") or {}).values() if isinstance(cfg, dict)):
        notes.append("pg_config has no group names (as gloo writes it): groups named from the entries, their ranks unknown")
    meta = {"rank": rank, "format": "flight-recorder", "fr_version": data.get("version"), "hostname": None}
    return RankView(rank, path, meta, groups, events, source_format="flight-recorder", notes=notes)


def _ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(r, int) for r in value):
        return tuple(value)
    return None


def _event(index: int, e: dict[str, Any], groups: dict[str, GroupInfo], done: dict[str, int]) -> CollectiveEvent:
    name = str(e.get("profiling_name") or "")
    kind = name.split(":", 1)[-1].strip()
    peer = None
    m = _P2P.match(kind)
    if m:
        op = m.group(1)
        a, b = int(m.group(2)), int(m.group(3))
        peer = b if op == "send" else a  # "send 0->1": to 1; "recv 0<-1" / "recv 1->0": from the other
    else:
        op = _OP_NAMES.get(kind, kind or "unknown")
    pg = e.get("process_group") or ("", "")
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
    completed = done.get(str(e.get("pg_id")))
    if completed is not None and seq is not None:  # both 1-based, as torch counts
        in_flight = seq > completed
    else:
        in_flight = e.get("state") not in (None, "completed")
    duration = e.get("duration_ms")
    return CollectiveEvent(
        index=index, op=op, key=f"fr:{kind}", aten_op=name, step=0, phase="?", module="?", group=group,
        seq=None if seq is None else seq - 1, dtype=dtype or out_dtype, input_shapes=in_shapes, output_shapes=out_shapes,
        input_bytes=in_bytes, output_bytes=out_bytes, size_bytes=size,
        busbw_factor=spec.busbw_factor(n) if spec else 0.0, source=_source(e.get("frames")),
        latency_s=None if duration is None else float(duration) / 1e3,
        peer=peer, p2p_seq=_int(e.get("p2p_seq_id")) if p2p else None, in_flight=in_flight,
    )


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
        total += math.prod(shape) * _DTYPES.get(str(dtypes[i]) if i < len(dtypes) else "", ("", 0))[1]
    first = str(dtypes[0]) if dtypes else None
    return total, tuple(shapes), _DTYPES[first][0] if first in _DTYPES else first


def _source(frames: Any) -> str | None:
    """The innermost frame of the user's code (frames are innermost first), as ``file:line``."""
    for f in frames or []:
        if isinstance(f, dict) and is_user_file(str(f.get("filename") or "")):
            return f"{f.get('filename')}:{f.get('line')}"
    return None
