"""Where a job's rank files are: one folder, a folder whose subfolders hold them (one per
node, as node-local disks make people write), several folders named together, or single files.

Every verb that reads a job lists its files here (:func:`find_job`; :func:`job_files` for the
files alone), so they all read the same files the same way:

- a folder's own rank files (``rank<R>.json``, streams ``rank<R>.jsonl``, Flight Recorder
  files ending in the rank, torch.profiler traces), one per rank (a rank with both a dump and a
  stream counts once: :func:`_dump_or_stream`);
- a folder with none of its own: its subfolders' (to :data:`DEPTH` levels down), each read as a
  folder of its own: ``run/node0`` and ``run/node1`` make one job of ``run/``;
- several paths: the union of theirs;
- refused, each in one line naming the files: one rank in two places, and dumps of two runs
  (different ``metadata.run_id``; dumps without one, such as Flight Recorder's, are of unknown
  run, never a conflict).

Besides the files, :class:`JobFiles` says what the reader saw around them
(:class:`~commdebug.model.presence.FolderScope`): the folders read, the ranks with a fault
record there, and the folders beside a node's folder where the job's other ranks may be.

    >>> job = find_job(["run/node0", "run/node1"])       # doctest: +SKIP
    >>> [f.name for f in job.files]                       # doctest: +SKIP
    ['rank0.json', 'rank1.json', 'rank2.json', 'rank3.json']
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from commdebug.errors import CommDebugError, DumpError, missing_path, no_rank_dumps
from commdebug.formats.profile_files import (
    NO_RANK,
    is_trace_name,
    profiles_with_their_dumps,
    refuse_two_of_a_rank,
    trace_rank,
)
from commdebug.model.fault import FAULT_SUFFIX
from commdebug.model.presence import FolderScope
from commdebug.model.stream import STREAM_SUFFIX

__all__ = ["Dumps", "JobFiles", "find_job", "job_files", "rank_files", "dump_files", "one_file", "as_paths", "dumps_name",
           "common_folder",
           "rank_from_name", "run_id_of", "PICKLE", "DEPTH"]

# what a verb's DUMPS argument may be: one path, or several (folders, or rank files)
Dumps = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

PICKLE = b"\x80"  # the first byte of a pickle (protocol 2+): Flight Recorder's binary dump
DEPTH = 3  # how far below a folder without rank files its subfolders are looked through
# files that sit beside the dumps and are no rank's dump: the viewer page, logs, fault records,
# the metrics each rank leaves at exit (rank<R>.prom)
_NOT_DUMPS = (".html", ".txt", ".log", ".prom", FAULT_SUFFIX)
_BESIDE_MOST = 64  # sibling folders looked at for a node's folder's missing ranks
_FAULT_NAME = re.compile(r"^(rank|pid)(\d+)" + re.escape(FAULT_SUFFIX) + "$")


def as_paths(dumps: Dumps) -> list[Path]:
    """The paths a DUMPS argument names: one, or several."""
    if isinstance(dumps, (str, os.PathLike)):
        return [Path(dumps)]
    paths = [Path(d) for d in dumps]
    if not paths:
        raise CommDebugError("no dump or folder given")
    return paths


def dumps_name(dumps: Dumps) -> str:
    """How messages name a DUMPS argument: its path, or its paths side by side."""
    return " ".join(str(p) for p in as_paths(dumps))


def common_folder(dumps: Dumps) -> Path:
    """The one folder a job's outputs go in (the folder page's index.html): the folder named, or
    the folder several paths share (``run`` for ``run/node0 run/node1``)."""
    paths = as_paths(dumps)
    if len(paths) == 1:
        return paths[0]
    common = os.path.commonpath([os.path.abspath(p) for p in paths])
    relative = os.path.relpath(common)
    return Path(relative if not relative.startswith("..") else common)


def one_file(dumps: Dumps) -> Path | None:
    """The file `dumps` names when it is one dump file (one path, not a folder); None for a
    folder or several paths. A single path that does not exist is an error here."""
    paths = as_paths(dumps)
    if len(paths) != 1:
        return None
    if not paths[0].exists():
        raise missing_path(paths[0])
    return None if paths[0].is_dir() else paths[0]


def dump_files(dumps: Dumps, *, live: bool = False) -> list[Path]:
    """The dumps `dumps` names: one file as it is, else :func:`job_files`."""
    single = one_file(dumps)
    return [single] if single is not None else job_files(dumps, live=live)


@dataclass
class JobFiles:
    """One job's rank files, in rank order, and what the reader saw around them."""

    files: list[Path]
    scope: FolderScope


_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.\w+)?$")


def rank_from_name(p: Path) -> int:
    """The rank of a dump file by its name (``rank3.json``, ``fr_trace_3``; a torch.profiler
    trace's ``rank3.pt.trace.json`` or, where the name has none, its ``distributedInfo``), or a
    :class:`DumpError`."""
    if is_trace_name(p.name):
        rank = trace_rank(p)
        if rank is None:
            raise DumpError(f"{p}: a torch.profiler trace that names no rank: no distributedInfo, and no 'rank<N>' in its name")
        return rank
    m = _TRAILING_NUMBER.search(p.name)
    if not m:
        raise DumpError(f"{p}: the rank is neither in the dump nor at the end of its name")
    return int(m.group(1))


def _rank_or_last(f: Path) -> int:
    """A file's rank for ordering; a profiler trace whose rank shows neither in its name nor in
    its head goes last (reading it says why)."""
    if is_trace_name(f.name):
        rank = trace_rank(f)
        return NO_RANK if rank is None else rank
    return rank_from_name(f)


def _one_of_each_rank(files: list[Path], live: bool) -> list[Path]:
    """One file per rank where a rank has both a dump and a stream (``rank1.json`` and
    ``rank1.jsonl``)."""
    dumps = {f.with_suffix(""): f for f in files if f.suffix == ".json"}
    streams = {f for f in files if f.suffix == STREAM_SUFFIX}
    out = []
    for f in files:
        if f.suffix == STREAM_SUFFIX and f.with_suffix("") in dumps:
            out.append(_dump_or_stream(dumps[f.with_suffix("")], f, live))
        elif f.suffix == ".json" and f.with_suffix(STREAM_SUFFIX) in streams:
            continue  # decided with its stream above
        else:
            out.append(f)
    return out


def _dump_or_stream(dump: Path, stream: Path, live: bool) -> Path:
    """Which of a rank's two files tells its story.

    A final dump holds everything its stream held (it replaces the stream at the end; a stream
    left beside it is one that could not be removed): the dump, whatever their times on disk. A
    hang watchdog's dump (``ended_by: "hang"``) says where the rank is stuck, while its stream
    keeps being touched to show the rank alive: the dump, unless the stream recorded progress (a
    new collective or step) after the dump was written, when the hang is over. ``live`` readers
    (``watch``) want the stream's heartbeats and waiting times: the newer file."""
    try:
        if live:
            return stream if stream.stat().st_mtime_ns > dump.stat().st_mtime_ns else dump
        if _ended_by_of(dump) != "hang":
            return dump
        progress = _last_progress(stream)
        return stream if progress is not None and progress > dump.stat().st_mtime else dump
    except OSError:  # one of them vanished meanwhile: keep the other
        return stream if not dump.exists() else dump


_ENDED_BY = re.compile(rb'"ended_by"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PROGRESS = re.compile(rb'"progress":(-?[0-9][0-9.eE+-]*)')


def _ended_by_of(dump: Path) -> str | None:
    """A dump's ``metadata.ended_by``, found by searching its bytes (as :func:`run_id_of`)."""
    found = _ENDED_BY.findall(dump.read_bytes())
    return found[-1].decode("utf-8", "replace") if len(set(found)) == 1 else None


def _last_progress(stream: Path, block: int = 1 << 16) -> float | None:
    """The wall time of a stream's last progress (its newest chunk's ``progress``), reading the
    file from its end; None when no chunk has one."""
    with open(stream, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            tail = f.read(end - start) + tail
            end = start
            found = _PROGRESS.findall(tail[tail.find(b"\n") + 1:] if start else tail)  # whole lines only
            if found:
                return float(found[-1])
    return None


def find_job(dumps: Dumps, *, live: bool = False, one_run: bool = True) -> JobFiles:
    """The rank files of the job `dumps` names (see the module docstring), one per rank, in
    rank order; ``live``: a rank's stream where it is newer than its dump (``watch``);
    ``one_run``: refuse dumps of different runs (every verb but ``watch``, which picks the
    newest run itself)."""
    paths = as_paths(dumps)
    folders: list[tuple[Path, list[Path], bool]] = []  # (folder, its rank files, named by the user)
    loose: list[Path] = []
    for p in paths:
        if not p.exists():
            raise missing_path(p)
        if not p.is_dir():
            loose.append(p)
            continue
        found = list(_folders_with_dumps(p, DEPTH))
        if not found:
            raise no_rank_dumps(p)
        folders.extend((folder, files, folder == p) for folder, files in found)
    files, seen = list(loose), {f.resolve() for f in loose}
    faulted: set[int] = set()
    pids: set[int] = set()
    read: list[Path] = []
    for folder, listed, _ in folders:
        if folder.resolve() in seen:  # the same folder named twice (or a folder and its parent)
            continue
        seen.add(folder.resolve())
        read.append(folder)
        files.extend(_one_folder(folder, listed, live))
        for kind, number in _faults(listed):
            (faulted if kind == "rank" else pids).add(number)
    ranks = {f: _rank_or_last(f) if f not in loose else _named_rank(f) for f in files}
    _refuse_two_places(files, ranks)
    files.sort(key=lambda f: (ranks[f], f.name))
    if one_run:
        _refuse_mixed_runs(str(paths[0]) if len(paths) == 1 else "the folders given", [(f, run_id_of(f)) for f in files])
    named = [folder for folder, _, by_name in folders if by_name]
    beside = _beside(named, set(read)) if len(named) == len(folders) else ()
    # the folders as the user named them ("run", not its run/node0 alone): what the notes say was read
    named_dirs = tuple(str(p) for p in paths if p.is_dir())
    scope = FolderScope(named_dirs, frozenset(faulted), frozenset(pids), beside, files_only=not read)
    return JobFiles(files, scope)


def job_files(dumps: Dumps, *, live: bool = False) -> list[Path]:
    """The rank files of one run (:func:`find_job`), refusing dumps of different runs.

    >>> job_files("traces/")      # doctest: +SKIP
    [PosixPath('traces/rank0.json'), PosixPath('traces/rank1.json')]
    """
    return find_job(dumps, live=live).files


def rank_files(dumps: Dumps, *, live: bool = False) -> list[Path]:
    """:func:`job_files` without the one-run rule: every rank file, whatever its run (``watch``
    keeps the newest run's itself)."""
    return find_job(dumps, live=live, one_run=False).files


def _listing(folder: Path) -> tuple[list[Path], list[Path]]:
    """(the files of `folder` that may be rank files or fault records, its subfolders)."""
    files, subfolders = [], []
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise DumpError(f"{folder}: cannot list the folder: {e.strerror or e}") from None
    for f in entries:
        if f.name.startswith("."):
            continue  # hidden: a file being written (atomic writes), a tool's own folder
        if f.is_dir():
            subfolders.append(f)
        elif f.is_file() and (f.suffix == FAULT_SUFFIX or (f.suffix not in _NOT_DUMPS and (is_trace_name(f.name) or _TRAILING_NUMBER.search(f.name)))):
            files.append(f)
    return files, subfolders


def _folders_with_dumps(folder: Path, depth: int) -> Iterator[tuple[Path, list[Path]]]:
    """`folder` with its rank files when it has any, else its subfolders' (to `depth` levels)."""
    files, subfolders = _listing(folder)
    if any(f.suffix != FAULT_SUFFIX for f in files):
        yield folder, files
        return
    if depth > 0:
        for sub in subfolders:
            yield from _folders_with_dumps(sub, depth - 1)


def _named_rank(f: Path) -> int:
    """A file named on its own: the rank its name ends in, else :data:`NO_RANK` (reading it
    says what is wrong, or finds the rank inside)."""
    try:
        return _rank_or_last(f)
    except DumpError:
        return NO_RANK


def _one_folder(folder: Path, listed: list[Path], live: bool) -> list[Path]:
    """One folder's rank files, one per rank."""
    files = profiles_with_their_dumps([f for f in listed if f.suffix != FAULT_SUFFIX])
    ranks = {f: _rank_or_last(f) for f in files}
    refuse_two_of_a_rank(folder, files, ranks)
    return _one_of_each_rank(files, live)


def _faults(listed: list[Path]) -> Iterator[tuple[str, int]]:
    """("rank", R) or ("pid", P) of each fault record listed."""
    for f in listed:
        m = _FAULT_NAME.match(f.name)
        if m:
            yield m.group(1), int(m.group(2))


def _refuse_two_places(files: list[Path], ranks: dict[Path, int]) -> None:
    """One rank, one file: a rank found in two folders (a copy, or two runs' folders named
    together) is refused, naming both."""
    where: dict[int, Path] = {}
    for f in files:
        rank = ranks[f]
        if rank >= NO_RANK:
            continue
        if rank in where:
            raise DumpError(f"rank {rank} is in two places: {where[rank]} and {f}; a job's ranks are read from one file "
                            "each (name each folder once, and leave out copies and other runs' folders)")
        where[rank] = f


def _beside(named: list[Path], read: set[Path]) -> tuple[str, ...]:
    """The folders next to the folders read (same parent) that hold rank files of their own:
    where a node's folder's missing ranks may be. Bounded: a few dozen folders, each looked
    into until its first rank file (a folder beside ``traces/`` may be anything)."""
    out: list[str] = []
    parents = {p.resolve().parent: p.parent for p in named}
    reading = {p.resolve() for p in read}
    for parent, shown in parents.items():
        try:
            siblings = sorted(d for d in parent.iterdir() if d.is_dir() and not d.name.startswith("."))[:_BESIDE_MOST]
        except OSError:
            continue
        out += [str(shown / d.name) for d in siblings if d.resolve() not in reading and _has_rank_files(d)]
    return tuple(out)


def _has_rank_files(folder: Path, most: int = 2000) -> bool:
    """Whether `folder` holds a rank file among its first `most` entries."""
    try:
        with os.scandir(folder) as entries:
            for n, entry in enumerate(entries):
                if n >= most:
                    return False
                name = entry.name
                if (not name.startswith(".") and Path(name).suffix not in _NOT_DUMPS and entry.is_file()
                        and (is_trace_name(name) or _TRAILING_NUMBER.search(name))):
                    return True
    except OSError:
        pass
    return False


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
    if raw[:1] == PICKLE:
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


def _refuse_mixed_runs(where: str, run_ids: list[tuple[Path, str | None]]) -> None:
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
    raise DumpError(f"{where}: the dumps come from {len(by_run)} runs, none the majority: {sets}")


def _names(files: list[Path], most: int = 4) -> str:
    """Up to `most` file names, then how many more."""
    shown = ", ".join(str(f) for f in files[:most])
    return shown if len(files) <= most else f"{shown} and {len(files) - most} more"

