"""A job's ranks as the offline tools see them: one :class:`RankView` (metadata, groups,
collective events) per dump, read one at a time from a folder, so a thousand ranks never sit in
memory together.

A folder may hold our dumps (``rank<R>.json``) or PyTorch Flight Recorder dumps (pickles named
``<prefix><rank>``, or their JSON form); each file is recognised by its content.

A folder is one job: :func:`job_files`, which every folder verb reads through, refuses a folder
whose dumps carry different ``metadata.run_id`` (a rank copied in from another launch would
otherwise be compared as if it were this one's). A dump without a run id (older dumps, Flight
Recorder's) is of unknown run, never a conflict.

    >>> for view in iter_ranks("traces/"):      # doctest: +SKIP
    ...     print(view.rank, len(view.events))
"""

from __future__ import annotations

import io
import json
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

__all__ = ["RankView", "load_rank", "rank_files", "job_files", "run_id_of", "iter_ranks"]


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
    # group name -> the last sequence number this rank saw completed, where the dump says
    # (Flight Recorder's pg_status); absent: unknown
    completed: dict[str, int] = field(default_factory=dict)


def load_rank(path: str | os.PathLike) -> RankView:
    """One dump file, ours or Flight Recorder's, as a :class:`RankView`."""
    p = Path(path)
    raw = read_dump_bytes(p)
    if raw[:1] == b"\x80":  # a pickle: Flight Recorder's binary dump
        from commdebug.formats.flight_recorder import from_flight_recorder

        return from_flight_recorder(_plain_unpickle(raw, p), p)
    data = parse_dump_json(raw, p)
    if isinstance(data, dict) and "entries" in data and "pg_config" in data:
        from commdebug.formats.flight_recorder import from_flight_recorder

        return from_flight_recorder(data, p)
    try:
        return _from_ours(data, p)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # a dump that parses but holds the wrong types somewhere: one line, never a traceback
        raise DumpError(f"{p}: malformed dump ({type(e).__name__}: {e})") from None


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers: all a Flight Recorder dump
    holds). A pickle naming any class or function could run code when loaded; it is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"not a plain Flight Recorder pickle: it names {module}.{name}")


def _plain_unpickle(raw: bytes, p: Path) -> Any:
    try:
        return _PlainUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise DumpError(f"{p}: {e}") from None
    except Exception as e:
        raise DumpError(f"{p}: not a readable Flight Recorder pickle ({type(e).__name__}: {e})") from None


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


def job_files(folder: str | os.PathLike) -> list[Path]:
    """:func:`rank_files`, refusing a folder whose dumps come from different runs.

    Every folder verb reads through this. Each file's run id is found by :func:`run_id_of`
    (a byte search, not a parse), so the check costs a read of each file, not a second parse.

    >>> job_files("traces/")      # doctest: +SKIP
    [PosixPath('traces/rank0.json'), PosixPath('traces/rank1.json')]
    """
    files = rank_files(folder)
    _refuse_mixed_runs(Path(folder), [(f, run_id_of(f)) for f in files])
    return files


def iter_ranks(path: str | os.PathLike) -> Iterator[RankView]:
    """Each rank of a folder (or the one dump a file is), loaded one at a time."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or folder")
    for f in job_files(p) if p.is_dir() else [p]:
        yield load_rank(f)


# ---------------------------------------------------------------------------- one run per folder

# A JSON object key "run_id" and its string value. Inside a JSON string a quote is escaped, so
# text that merely mentions "run_id" (a module name, a source line) never matches.
_RUN_ID = re.compile(rb'"run_id"\s*:\s*("(?:[^"\\]|\\.)*")')


def run_id_of(path: str | os.PathLike) -> str | None:
    """The ``metadata.run_id`` of one of our dumps, or None (absent, unreadable, or a Flight
    Recorder dump): found by searching the bytes, the whole JSON is not parsed.

    >>> run_id_of("traces/rank0.json")      # doctest: +SKIP
    '5f0c...'
    """
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None  # reading it for real says what is wrong
    if raw[:1] == b"\x80":
        return None  # a Flight Recorder pickle: no run id
    found = {m.group(1) for m in _RUN_ID.finditer(raw)}
    if len(found) > 1:  # the key elsewhere too (unusual metadata): ask the parsed dump
        return _parsed_run_id(raw)
    try:
        value = json.loads(found.pop()) if found else None
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _parsed_run_id(raw: bytes) -> str | None:
    try:
        meta = json.loads(raw)["commdebug"]["metadata"]
    except (ValueError, KeyError, TypeError):
        return None
    value = meta.get("run_id") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


def _refuse_mixed_runs(folder: Path, run_ids: list[tuple[Path, str | None]]) -> None:
    """A :class:`DumpError` naming the odd files when the dumps carry different run ids: the
    files outside the largest set, or every set when none is larger than all others."""
    by_run: dict[str, list[Path]] = {}
    for f, run in run_ids:
        if run is not None:
            by_run.setdefault(run, []).append(f)
    if len(by_run) < 2:
        return
    # largest set first; among equals, the set holding the earliest file (files are in rank order)
    ordered = sorted(by_run.items(), key=lambda kv: -len(kv[1]))
    (major, major_files), rest = ordered[0], ordered[1:]
    if len(major_files) > len(rest[0][1]):
        odd = [f for f, run in run_ids if run is not None and run != major]
        runs = ", ".join(run for run, _ in rest)
        verb, which = ("belongs", "another run") if len(odd) == 1 else ("belong", "another run" if len(rest) == 1 else "other runs")
        raise DumpError(f"{_names(odd)} {verb} to {which} (run_id{'s' if len(rest) > 1 else ''} {runs}) than the other "
                        f"{len(major_files)} dump{'s' if len(major_files) != 1 else ''} (run_id {major})")
    sets = "; ".join(f"{_names(fs)} (run_id {run})" for run, fs in by_run.items())
    raise DumpError(f"{folder}: the dumps come from {len(by_run)} runs, none the majority: {sets}")


def _names(files: list[Path], most: int = 4) -> str:
    """Up to `most` file names, then how many more."""
    shown = ", ".join(str(f) for f in files[:most])
    return shown if len(files) <= most else f"{shown} and {len(files) - most} more"

