"""The JSON dump: write a trace as the reference's node tree plus a versioned ``commdebug``
section (docs/json-format.md), and load ours or the reference's back into a :class:`Trace`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.fileio import write_text_atomic
from commdebug.model.events import decode_events, encode_events
from commdebug.model.trace import GLOBAL, PHASES, TRIVIAL_OPS, CollectiveEvent, GroupInfo, Trace, check_noise_level, ops_at_noise

__all__ = ["SCHEMA_VERSION", "to_dump_dict", "write_dump", "load", "read_dump_json", "from_dump_dict"]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
_OP_LISTS = {
    "forward": "operations_forward",
    "backward": "operations_backward",
    "checkpoint": "operations_checkpointing",
    "optimizer": "operations_optimizer",  # ours; the reference has no optimizer phase
}


def to_dump_dict(trace: Trace, noise_level: int = 3) -> dict[str, Any]:
    """The dump of a trace as a JSON-ready dict; op rows filtered by ``noise_level``."""
    check_noise_level(noise_level)

    def node(fqn: str) -> dict[str, Any]:
        info = trace.modules[fqn]
        d: dict[str, Any] = {
            "fqn": fqn,
            "module_type": info.module_type if noise_level >= 1 else "",
            "parameters": [[n, p] for n, p in info.parameters.items()] if noise_level >= 1 else [],
            "children": [],
            # the reference counts recompute as backward and knows no optimizer phase
            "collectives_forward": list(map(list, _merged_counts(trace, fqn, ("forward", "optimizer")).items())),
            "collectives_backward": list(map(list, _merged_counts(trace, fqn, ("backward", "checkpoint")).items())),
        }
        for phase, key in _OP_LISTS.items():
            d[key] = [
                {
                    "name": r.name,
                    "input_shape": list(r.input_shape),
                    "input_sharding": list(r.input_sharding),
                    "device_mesh": r.device_mesh,
                    "is_bw": phase in ("backward", "checkpoint"),
                    "is_activation_checkpointing": phase == "checkpoint",
                    "count": r.count,
                }
                for r in ops_at_noise(trace.operations(fqn, phase), noise_level)
            ]
        totals = {p: trace.phase_totals(fqn, p) for p in PHASES}
        d["commdebug_node"] = {
            "bytes": {p: totals[p][1] for p in PHASES},
            "counts": {p: totals[p][0] for p in PHASES},
            "collectives": [
                {"op": s.op, "key": s.key, "phase": p, "group": s.group.name, "count": s.count, "bytes": s.bytes}
                for p in PHASES
                for s in trace.collective_stats(fqn, p)
            ],
        }
        d["children"] = [node(c) for c in info.children]
        return d

    root = node(GLOBAL)
    root["commdebug"] = {
        "schema_version": SCHEMA_VERSION,
        "noise_level": noise_level,
        "trivial_ops": sorted(TRIVIAL_OPS),
        "metadata": {**trace.metadata, "steps": trace.steps},
        "groups": {name: g.to_dict() for name, g in trace.groups.items()},
        "summary": trace.summary(),
        "events": encode_events(trace.events),
        "events_dropped": trace.events_dropped,
        "max_events": trace.max_events,
    }
    return root


def _merged_counts(trace: Trace, fqn: str, phases: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for phase in phases:
        for key, n in trace.collective_counts(fqn, phase).items():
            out[key] = out.get(key, 0) + n
    return out


def write_dump(trace: Trace, file_name: str | os.PathLike, noise_level: int = 3) -> Path:
    """Write the dump atomically (temp file then rename), creating parent folders."""
    return write_text_atomic(file_name, json.dumps(to_dump_dict(trace, noise_level), indent=1))


def load(path: str | os.PathLike) -> Trace:
    """Load a dump written by commdebug or by torch's CommDebugMode into a :class:`Trace`.

    >>> trace = commdebug.load("comm_mode_log.json")     # doctest: +SKIP
    >>> print(commdebug.render.table.render_table(trace, 0))     # doctest: +SKIP

    Raises :class:`DumpError` naming the file and the problem: missing, not JSON, not a dump,
    or written by a newer commdebug (unknown schema version).
    """
    data = read_dump_json(path)
    return from_dump_dict(data, str(path))


def read_dump_json(path: str | os.PathLike) -> Any:
    """The parsed JSON of a dump file, or a :class:`DumpError` saying why it cannot be read."""
    return parse_dump_json(read_dump_bytes(path), path)


def read_dump_bytes(path: str | os.PathLike) -> bytes:
    """A dump file's bytes, or a :class:`DumpError` naming the file and the problem."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise DumpError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise DumpError(f"{p}: is a directory, not a dump file") from None
    except OSError as e:
        raise DumpError(f"{p}: cannot read: {e.strerror or e}") from None


def parse_dump_json(raw: bytes, path: str | os.PathLike) -> Any:
    """Parse a dump's bytes as JSON, or a :class:`DumpError` naming the file and the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DumpError(f"{path}: not a JSON dump (not UTF-8 text)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def from_dump_dict(data: Any, source: str = "<dump>") -> Trace:
    """Build a trace from a parsed dump (ours or the reference's). See :func:`load`."""
    if not isinstance(data, dict) or "fqn" not in data or "children" not in data:
        raise DumpError(f"{source}: not a CommDebugMode dump (the root needs 'fqn' and 'children')")
    section = data.get("commdebug")
    if section is not None:
        version = section.get("schema_version") if isinstance(section, dict) else None
        if version not in READABLE_VERSIONS:
            raise DumpError(
                f"{source}: dump schema version {version!r} is not supported "
                f"(this commdebug reads versions {', '.join(map(str, READABLE_VERSIONS))}; upgrade commdebug)"
            )
    try:
        return _build(data, section, source)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DumpError(f"{source}: malformed dump ({type(e).__name__}: {e})") from None


def _build(root: dict[str, Any], section: dict[str, Any] | None, source: str) -> Trace:
    trace = Trace(max_events=section.get("max_events") if section else None)
    events: list[CollectiveEvent] = []
    if section:
        # groups first: events and node aggregates refer to them by name
        for name, g in (section.get("groups") or {}).items():
            trace.add_group(GroupInfo.from_dict(name, g))
        raw = section.get("events")
        if isinstance(raw, list):  # schema 1: one object per event, the group inline
            events = [CollectiveEvent.from_dict(e, trace.groups) for e in raw]
        else:
            events = decode_events(raw, trace.groups, source) if raw is not None else []
        for e in events:  # schema 1 keeps groups inside events only
            trace.add_group(e.group)
    stack: list[tuple[dict[str, Any], str | None]] = [(root, None)]
    while stack:
        node, parent = stack.pop()
        fqn = str(node["fqn"])
        if fqn in trace.modules and fqn != GLOBAL:
            continue  # the reference repeats a module called twice; its counts are already in
        if fqn != GLOBAL:
            trace.add_module(fqn, parent, str(node.get("module_type", "")), {str(n): str(p) for n, p in node.get("parameters", [])})
        _read_collectives(trace, fqn, node)
        for phase, key in _OP_LISTS.items():
            for row in node.get(key) or []:
                sig = (str(row["name"]), tuple(map(str, row.get("input_shape", []))), tuple(map(str, row.get("input_sharding", []))), str(row.get("device_mesh", "")))
                bucket = trace.ops.setdefault((fqn, phase), {})
                bucket[sig] = bucket.get(sig, 0) + int(row.get("count", 1))
        stack.extend((child, fqn) for child in reversed(node["children"]))
    if section:
        trace.noise_level = int(section.get("noise_level", 3))
        trace.metadata = dict(section.get("metadata") or {})
        trace.events.extend(events)
        trace.events_total = len(events) + int(section.get("events_dropped", 0))
        trace.step = int(trace.metadata.get("steps", 0) or 0)
    else:
        trace.metadata = {"format": "torch.distributed.tensor.debug.CommDebugMode"}
        trace.bytes_recorded = False
    return trace


def _read_collectives(trace: Trace, fqn: str, node: dict[str, Any]) -> None:
    ours = node.get("commdebug_node")
    if ours is not None:
        for s in ours.get("collectives", []):
            key = (str(s["key"]), str(s["op"]), str(s["group"]))
            if "group_size" in s:  # schema 1 keeps group sizes here
                trace.add_group(GroupInfo(key[2], "", int(s["group_size"]), None))
            trace.collectives.setdefault((fqn, str(s["phase"])), {})[key] = [int(s["count"]), int(s["bytes"])]
        return
    # a reference dump: counts only, no groups or bytes
    for phase, field in (("forward", "collectives_forward"), ("backward", "collectives_backward")):
        for key, count in node.get(field, []):
            trace.collectives.setdefault((fqn, phase), {})[(str(key), _ops.op_for_key(str(key)), "?")] = [int(count), 0]
