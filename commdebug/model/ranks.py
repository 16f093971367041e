"""A job's ranks as the offline tools see them: one :class:`RankView` (metadata, groups,
collective events) per dump, read one at a time from a folder, so a thousand ranks never sit in
memory together.

A folder may hold our dumps (``rank<R>.json``) or PyTorch Flight Recorder dumps (pickles named
``<prefix><rank>``, or their JSON form); each file is recognised by its content.
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from commdebug.errors import DumpError
from commdebug.model.dump import READABLE_VERSIONS, parse_dump_json, read_dump_bytes
from commdebug.model.events import decode_events
from commdebug.model.trace import CollectiveEvent, GroupInfo

__all__ = ["RankView", "load_rank", "rank_files", "iter_ranks"]


@dataclass
class RankView:
    """One rank's collectives: enough for reports, checks and traces, without the module tree."""

    rank: int
    path: Path
    metadata: dict[str, Any]
    groups: dict[str, GroupInfo]
    events: list[CollectiveEvent]
    source_format: str = "commdebug"  # or "flight-recorder"
    notes: list[str] = field(default_factory=list)


def load_rank(path: str | os.PathLike) -> RankView:
    """One dump file, ours or Flight Recorder's, as a :class:`RankView`."""
    p = Path(path)
    raw = read_dump_bytes(p)
    if raw[:1] == b"\x80":  # a pickle: Flight Recorder's binary dump
        from commdebug.formats.flight_recorder import from_flight_recorder

        try:
            data = pickle.loads(raw)
        except Exception as e:
            raise DumpError(f"{p}: not a readable Flight Recorder pickle ({type(e).__name__}: {e})") from None
        return from_flight_recorder(data, p)
    data = parse_dump_json(raw, p)
    if isinstance(data, dict) and "entries" in data and "pg_config" in data:
        from commdebug.formats.flight_recorder import from_flight_recorder

        return from_flight_recorder(data, p)
    return _from_ours(data, p)


def _from_ours(data: Any, p: Path) -> RankView:
    section = data.get("commdebug") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        if isinstance(data, dict) and "fqn" in data:
            raise DumpError(f"{p}: a dump of torch's CommDebugMode has no events or ranks; record with commdebug")
        raise DumpError(f"{p}: not a commdebug dump or a Flight Recorder dump")
    version = section.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise DumpError(f"{p}: dump schema version {version!r} is not supported (this commdebug reads versions {', '.join(map(str, READABLE_VERSIONS))})")
    meta = dict(section.get("metadata") or {})
    groups = {str(n): GroupInfo.from_dict(n, g) for n, g in (section.get("groups") or {}).items()}
    raw = section.get("events") or []
    try:
        if isinstance(raw, list):  # schema 1
            events = [CollectiveEvent.from_dict(e, groups) for e in raw]
            for e in events:
                groups.setdefault(e.group.name, e.group)
        else:
            events = decode_events(raw, groups, str(p))
    except (KeyError, TypeError, ValueError) as e:
        raise DumpError(f"{p}: malformed events ({type(e).__name__}: {e})") from None
    rank = meta.get("rank")
    if not isinstance(rank, int):
        rank = _rank_from_name(p)
    view = RankView(int(rank), p, meta, groups, events)
    if section.get("events_dropped"):
        view.notes.append(f"{section['events_dropped']} older events were dropped (max_events)")
    return view


_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.\w+)?$")


def _rank_from_name(p: Path) -> int:
    m = _TRAILING_NUMBER.search(p.name)
    if not m:
        raise DumpError(f"{p}: the rank is neither in the dump nor at the end of its name")
    return int(m.group(1))


def rank_files(folder: str | os.PathLike) -> list[Path]:
    """The dump files of a folder, in rank order (by the number ending their name)."""
    d = Path(folder)
    if not d.exists():
        raise DumpError(f"{d}: no such folder")
    if not d.is_dir():
        raise DumpError(f"{d}: not a folder")
    files = [f for f in d.iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix not in (".html", ".txt", ".log") and _TRAILING_NUMBER.search(f.name)]
    if not files:
        raise DumpError(f"{d}: no rank dumps in this folder (expected rank<N>.json or Flight Recorder files)")
    return sorted(files, key=lambda f: (int(_TRAILING_NUMBER.search(f.name).group(1)), f.name))


def iter_ranks(path: str | os.PathLike) -> Iterator[RankView]:
    """Each rank of a folder (or the one dump a file is), loaded one at a time."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or folder")
    for f in rank_files(p) if p.is_dir() else [p]:
        yield load_rank(f)

