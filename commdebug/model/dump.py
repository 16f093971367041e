"""The JSON dump, the trace model's serialised form: a trace as the reference's node tree plus
a versioned ``commdebug`` section (docs/json-format.md), and a parsed dump (ours or the
reference's) back into a :class:`Trace` or a :class:`RankView`. Files are read by
:mod:`commdebug.formats.readers` and written by :mod:`commdebug.fileio`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.model.aggregates import Aggregates, set_older
from commdebug.model.events import decode_events, encode_events
from commdebug.model.rank_view import RankView
from commdebug.model.trace import (
    BACKWARD,
    CHECKPOINT,
    FORWARD,
    GLOBAL,
    OPTIMIZER,
    PHASES,
    TRIVIAL_OPS,
    CollectiveEvent,
    GroupInfo,
    Trace,
    check_noise_level,
    ops_at_noise,
)

__all__ = ["SCHEMA_VERSION", "to_dump_dict", "dump_text", "from_dump_dict", "rank_view_from_dump_dict", "check_schema"]

# 3: a size not known (size_bytes, input_bytes, output_bytes, busbw_factor, a node's bytes) is
# null, never 0; 2 and 1 are read as before (their sizes are all known)
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
_OP_LISTS = {
    FORWARD: "operations_forward",
    BACKWARD: "operations_backward",
    CHECKPOINT: "operations_checkpointing",
    OPTIMIZER: "operations_optimizer",  # ours; the reference has no optimizer phase
}


def to_dump_dict(trace: Trace, noise_level: int = 3, events: list[CollectiveEvent] | None = None,
                 older: Aggregates | None = None) -> dict[str, Any]:
    """The dump of a trace as a JSON-ready dict; op rows filtered by ``noise_level``.

    ``events`` and ``older`` (a recording session with ``keep_steps``): the events to keep one
    by one instead of the trace's, and the totals of all the others."""
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
                {"op": s.op, "key": s.key, "phase": p, "group": s.group.name, "count": s.count, "bytes": s.bytes,
                 **({"unknown_size": s.unknown} if s.unknown else {})}
                for p in PHASES
                for s in trace.collective_stats(fqn, p)
            ],
        }
        unknown = {p: n for p in PHASES if (n := trace.unknown_sizes(fqn, p))}
        if unknown:  # schema 3: calls whose size is not known, left out of "bytes"
            d["commdebug_node"]["unknown_size"] = unknown
        d["children"] = [node(c) for c in info.children]
        return d

    root = node(GLOBAL)
    root["commdebug"] = {
        "schema_version": SCHEMA_VERSION,
        "noise_level": noise_level,
        "trivial_ops": sorted(TRIVIAL_OPS),
        "metadata": {**trace.metadata, "steps": trace.steps},
        "groups": {name: g.to_dict() for name, g in trace.groups.items()},
        "summary": trace.totals(),
        "events": encode_events(trace.events if events is None else events),
        "events_dropped": trace.events_dropped if events is None else max(trace.events_total - len(events), 0),
        "max_events": trace.max_events,
    }
    if older is not None:
        root["commdebug"]["older"] = older.to_dict()
    return root


def _merged_counts(trace: Trace, fqn: str, phases: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for phase in phases:
        for key, n in trace.collective_counts(fqn, phase).items():
            out[key] = out.get(key, 0) + n
    return out


def dump_text(trace: Trace, noise_level: int = 3, events: list[CollectiveEvent] | None = None,
              older: Aggregates | None = None) -> str:
    """The dump of a trace as JSON text (what ``generate_json_dump`` and ``commdebug run`` write);
    ``events`` and ``older`` as in :func:`to_dump_dict`."""
    return json.dumps(to_dump_dict(trace, noise_level, events, older), indent=1)


def check_schema(section: Any, source: str) -> None:
    """A :class:`DumpError` unless `section` (a dump's ``commdebug`` object) has a version this
    commdebug reads: the one schema check every reader goes through."""
    version = section.get("schema_version") if isinstance(section, dict) else None
    if version not in READABLE_VERSIONS:
        raise DumpError(
            f"{source}: dump schema version {version!r} is not supported "
            f"(this commdebug reads versions {', '.join(map(str, READABLE_VERSIONS))}; upgrade commdebug)"
        )


def from_dump_dict(data: Any, source: str = "<dump>") -> Trace:
    """Build a trace from a parsed dump (ours or the reference's). See :func:`load`."""
    if not isinstance(data, dict) or "fqn" not in data or "children" not in data:
        raise DumpError(f"{source}: not a CommDebugMode dump (the root needs 'fqn' and 'children')")
    section = data.get("commdebug")
    if section is not None:
        check_schema(section, source)
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
                bucket = trace.op_counts.setdefault((fqn, phase), {})
                bucket[sig] = bucket.get(sig, 0) + int(row.get("count", 1))
        stack.extend((child, fqn) for child in reversed(node["children"]))
    if section:
        trace.noise_level = int(section.get("noise_level", 3))
        trace.metadata = dict(section.get("metadata") or {})
        trace.events.extend(events)
        trace.events_total = len(events) + int(section.get("events_dropped", 0))
        trace.step = int(trace.metadata.get("steps", 0) or 0)
        if section.get("older") is not None:
            set_older(trace, Aggregates.from_dict(section["older"]))
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
            count = int(s["count"])
            unknown = count if s["bytes"] is None else int(s.get("unknown_size") or 0)  # schema 3: sizes may be unknown
            trace.collectives.setdefault((fqn, str(s["phase"])), {})[key] = [count, int(s["bytes"] or 0), unknown]
        return
    # a reference dump: counts only, no groups or bytes (every size unknown)
    for phase, field in (("forward", "collectives_forward"), ("backward", "collectives_backward")):
        for key, count in node.get(field, []):
            trace.collectives.setdefault((fqn, phase), {})[(str(key), _ops.op_for_key(str(key)), "?")] = [int(count), 0, int(count)]


def rank_view_from_dump_dict(data: Any, path: Path, rank_from_name: Callable[[], int]) -> RankView:
    """One rank of a parsed dump as a :class:`RankView` (events and groups, no module tree),
    without building the tree; ``rank_from_name`` gives the rank when the metadata has none."""
    section = data.get("commdebug") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        if isinstance(data, dict) and "fqn" in data:
            raise DumpError(f"{path}: a dump of torch's CommDebugMode has no events or ranks; record with commdebug")
        raise DumpError(f"{path}: not a commdebug dump or a Flight Recorder dump")
    check_schema(section, str(path))
    try:
        meta = dict(section.get("metadata") or {})
        groups = {str(n): GroupInfo.from_dict(n, g) for n, g in (section.get("groups") or {}).items()}
        raw = section.get("events") or []
        if isinstance(raw, list):  # schema 1
            events = [CollectiveEvent.from_dict(e, groups) for e in raw]
            for e in events:
                groups.setdefault(e.group.name, e.group)
        else:
            events = decode_events(raw, groups, str(path))
        rank = meta.get("rank")
        view = RankView(int(rank) if isinstance(rank, int) else rank_from_name(), path, meta, groups, events)
        older = Aggregates.from_dict(section["older"]) if section.get("older") is not None else None
        set_older(view, older)
        lost = int(section.get("events_dropped") or 0) - (older.events if older is not None else 0)
        if older is not None and older.events:
            view.notes.append(f"{older.events} events of older steps are kept as totals only (keep_steps, max_events)")
        if lost > 0:
            view.notes.append(f"{lost} older events were dropped (max_events)")
        return view
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # a dump that parses but holds the wrong types somewhere: one line, never a traceback
        raise DumpError(f"{path}: malformed dump ({type(e).__name__}: {e})") from None
