"""Every file commdebug reads comes in here: one rank's dump, a folder of them, ours or PyTorch
Flight Recorder's, each told by its content.

- :func:`load` gives a :class:`~commdebug.model.trace.Trace` (our dump, or torch's
  CommDebugMode's) with the module tree: what ``table``, ``summary`` and the viewer show.
- :func:`load_rank` gives a :class:`~commdebug.model.rank_view.RankView` (events and groups,
  no tree) of our dump or a Flight Recorder one: what ``check``, ``report`` and ``trace`` read.
- :func:`read` gives whichever of the two the file holds: a Trace for our dumps, a RankView
  for Flight Recorder's.
- :func:`iter_ranks` walks a folder (or one file) a rank at a time, and :func:`read_all` reads
  a list of files with either reader, in parallel worker processes when it pays (``-j``:
  :func:`default_jobs`), giving results in file order; :func:`job_files` lists a
  folder's dumps in rank order and refuses a folder whose dumps carry different
  ``metadata.run_id`` (a rank copied in from another launch would otherwise be compared as if it
  were this one's; a dump without a run id, such as Flight Recorder's, is never a conflict).

A rank's fault record (``rank<R>.fault``, written when a fatal signal ended its process:
:mod:`commdebug.model.fault`) is read with its dump or stream, into ``metadata.fault``, where
its pid and run id are the rank's.

A rank's stream (``rank<R>.jsonl``, written while the program runs: docs/streaming.md) is read
by all of them, up to a torn last chunk (said in a note); in a folder, a rank with both a dump
and a stream counts once: by its final dump, or by its hang dump until the stream shows progress
after it (``watch`` reads the newer of the two).

Every problem is a :class:`~commdebug.errors.DumpError` naming the file, never a traceback.

JSON is parsed by orjson when it is installed (about 10x the standard library's speed on a
dump's columns), else by :mod:`json`; a file orjson refuses (``NaN``, integers past 64 bits,
bad UTF-8) is parsed again by :mod:`json`, so both give the same data and the same errors.

    >>> for view in iter_ranks("traces/"):      # doctest: +SKIP
    ...     print(view.rank, len(view.events))
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import pickle
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from commdebug.errors import DumpError, empty_file, missing_path, no_rank_dumps
from commdebug.formats.faults import with_fault
from commdebug.formats.flight_recorder import from_flight_recorder, is_flight_recorder
from commdebug.formats.kineto import is_profiler_trace
from commdebug.formats.profile_files import (
    NO_RANK,
    is_trace_name,
    profiles_with_their_dumps,
    refuse_two_of_a_rank,
    trace_rank,
)
from commdebug.formats.profile_join import attach_profile, profile_path_for
from commdebug.formats.profiler import profile_view, read_profile
from commdebug.model.aggregates import older_of, set_older
from commdebug.model.dump import from_dump_dict, rank_view_from_dump_dict
from commdebug.model.fault import FAULT_SUFFIX
from commdebug.model.profile import Profile
from commdebug.model.rank_view import RankView, trace_of_view
from commdebug.model.stream import STREAM_SUFFIX, is_stream, parse_stream, stream_rank_view, stream_trace
from commdebug.model.trace import CollectiveEvent, Trace

if TYPE_CHECKING:
    from concurrent.futures import Future

_gunzip: Callable[[bytes, int], bytes]
_GzipError: tuple[type[Exception], ...]
try:  # ISA-L's inflate, about twice zlib's speed on a gzipped torch.profiler trace (docs/overlap.md)
    from isal import isal_zlib

    _gunzip, _GzipError = isal_zlib.decompress, (cast("type[Exception]", isal_zlib.error), zlib.error)
except ImportError:  # optional: zlib reads the same files
    _gunzip, _GzipError = zlib.decompress, (zlib.error,)

_orjson: Any
try:
    import orjson as _orjson
except ImportError:  # optional at run time: the standard library's parser reads the same files
    _orjson = None

__all__ = ["load", "load_rank", "read", "read_json", "rank_from_name", "rank_files", "job_files", "run_id_of",
           "iter_ranks", "read_all", "default_jobs"]

_PICKLE = b"\x80"  # the first byte of a pickle (protocol 2+): Flight Recorder's binary dump


_GZIP = b"\x1f\x8b"


def read_bytes(path: str | os.PathLike) -> bytes:
    """A dump file's bytes (decompressed when gzipped: ``.json.gz`` profiler traces), or a
    :class:`DumpError` naming the file and the problem."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise missing_path(p) from None
    except IsADirectoryError:
        raise DumpError(f"{p}: is a folder, not a dump file") from None
    except OSError as e:
        raise DumpError(f"{p}: cannot read: {e.strerror or e}") from None
    if not raw:
        raise empty_file(p)
    if raw[:2] == _GZIP:
        try:
            return _gunzip(raw, 31)  # 31: a gzip header and trailer
        except _GzipError as e:
            raise DumpError(f"{p}: not a complete gzip file ({e})") from None
    return raw


def parse_json(raw: bytes, path: str | os.PathLike) -> Any:
    """Parse a dump's bytes as JSON, or a :class:`DumpError` naming the file and the problem."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # the standard library says what is wrong, or reads what orjson does not (NaN)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DumpError(f"{path}: not a JSON dump (not UTF-8 text)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def read_json(path: str | os.PathLike) -> Any:
    """The parsed JSON of a dump file, or a :class:`DumpError` saying why it cannot be read."""
    return parse_json(read_bytes(path), path)


def _parsed(path: Path) -> tuple[str, Any]:
    """("flight-recorder" | "stream" | "profile" | "json", the file's data): the one place a
    file's kind is told."""
    raw = read_bytes(path)
    if raw[:1] == _PICKLE:
        return "flight-recorder", _plain_unpickle(raw, path)
    if is_stream(raw):  # a rank's live stream (docs/streaming.md), maybe cut short by a kill
        return "stream", parse_stream(raw, str(path))
    if is_profiler_trace(raw):  # a torch.profiler trace: read from its bytes, not parsed whole
        return "profile", read_profile(raw, path, lambda: trace_rank(path))
    data = parse_json(raw, path)
    return ("flight-recorder" if is_flight_recorder(data) else "json"), data


def read_profile_file(path: str | os.PathLike) -> Profile:
    """One torch.profiler trace file as a :class:`~commdebug.model.profile.Profile`."""
    p = Path(path)
    kind, data = _parsed(p)
    if kind != "profile":
        raise DumpError(f"{p}: not a torch.profiler trace")
    return cast(Profile, data)


def _with_profile(view: RankView) -> RankView:
    """A rank's dump or stream with the profile beside it attached (docs/overlap.md)."""
    return attach_profile(view, read_profile_file)


def _trace_with_profile(trace: Trace, path: Path) -> Trace:
    """:func:`_with_profile` for a :class:`Trace`: its events in the profiled steps take the
    profile's latencies, and the profile rides along (the folder page's overlap chart)."""
    if not profile_path_for(path).is_file():
        return trace
    rank = trace.metadata.get("rank")
    view = RankView(int(rank) if isinstance(rank, int) else rank_from_name(path), path, trace.metadata, trace.groups,
                    list(trace.events))
    set_older(view, older_of(trace))
    _with_profile(view)
    trace.events = deque(view.events, maxlen=trace.max_events)
    trace.profile = view.profile
    trace.metadata.setdefault("read_notes", []).extend(view.notes)
    return trace


def load(path: str | os.PathLike) -> Trace:
    """Load a dump written by commdebug or by torch's CommDebugMode into a :class:`Trace`.

    >>> trace = commdebug.load("comm_mode_log.json")     # doctest: +SKIP
    >>> print(commdebug.render.table.render_table(trace, 0))     # doctest: +SKIP

    Raises :class:`DumpError` naming the file and the problem: missing, not JSON, not a dump,
    or written by a newer commdebug (unknown schema version).
    """
    raw = read_bytes(path)
    if is_stream(raw):
        return with_fault(stream_trace(parse_stream(raw, str(path))), Path(path))
    if is_profiler_trace(raw):
        return trace_of_view(profile_view(read_profile(raw, Path(path), lambda: trace_rank(Path(path)))))
    return with_fault(from_dump_dict(parse_json(raw, path), str(path)), Path(path))


def read(path: str | os.PathLike) -> Trace | RankView:
    """What one file holds: a :class:`Trace` for a commdebug (or torch CommDebugMode) dump, or a
    torch.profiler trace (its module tree the root alone); a :class:`RankView` for a Flight
    Recorder dump, which has no module tree.

    >>> data = read("traces/rank0.json")      # doctest: +SKIP
    """
    p = Path(path)
    kind, data = _parsed(p)
    if kind == "flight-recorder":
        return from_flight_recorder(data, p, rank_from_name(p))
    if kind == "stream":
        return _trace_with_profile(with_fault(stream_trace(data), p), p)
    if kind == "profile":
        return trace_of_view(profile_view(data))
    return _trace_with_profile(with_fault(from_dump_dict(data, str(p)), p), p)


def load_rank(path: str | os.PathLike) -> RankView:
    """One dump file, ours or Flight Recorder's, as a :class:`RankView`."""
    p = Path(path)
    kind, data = _parsed(p)
    if kind == "flight-recorder":
        return from_flight_recorder(data, p, rank_from_name(p))
    if kind == "profile":
        return profile_view(data)
    if kind == "stream":
        return _with_profile(with_fault(stream_rank_view(data, p, lambda: rank_from_name(p)), p))
    return _with_profile(with_fault(rank_view_from_dump_dict(data, p, lambda: rank_from_name(p)), p))


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


def rank_files(folder: str | os.PathLike, *, live: bool = False) -> list[Path]:
    """The dump files of a folder, in rank order (by the number ending their name); for a rank
    with both a dump and a stream, the one :func:`_dump_or_stream` picks."""
    d = Path(folder)
    if not d.exists():
        raise missing_path(d)
    if not d.is_dir():
        raise DumpError(f"{d}: not a folder")
    found = [f for f in d.iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix not in (".html", ".txt", ".log", FAULT_SUFFIX)]
    files = [f for f in found if is_trace_name(f.name) or _TRAILING_NUMBER.search(f.name)]
    if not files:
        raise no_rank_dumps(d)
    files = profiles_with_their_dumps(files)
    ranks = {f: _rank_or_last(f) for f in files}
    refuse_two_of_a_rank(d, files, ranks)
    return sorted(_one_of_each_rank(files, live), key=lambda f: (ranks[f], f.name))


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


def job_files(folder: str | os.PathLike, *, live: bool = False) -> list[Path]:
    """:func:`rank_files`, refusing a folder whose dumps come from different runs.

    Every folder verb reads through this. Each file's run id is found by :func:`run_id_of`
    (a byte search, not a parse), so the check costs a read of each file, not a second parse.

    >>> job_files("traces/")      # doctest: +SKIP
    [PosixPath('traces/rank0.json'), PosixPath('traces/rank1.json')]
    """
    files = rank_files(folder, live=live)
    _refuse_mixed_runs(Path(folder), [(f, run_id_of(f)) for f in files])
    return files


def iter_ranks(path: str | os.PathLike, *, live: bool = False, jobs: int | None = 1,
               digest: Callable[[RankView], Any] | None = None) -> Iterator[Any]:
    """Each rank of a folder (or the one dump a file is), in rank order, as a RankView or its
    `digest` (see :func:`read_all`); ``live``: a rank's stream where it is newer than its dump
    (see :func:`_dump_or_stream`); ``jobs``: processes reading (None: :func:`default_jobs`)."""
    p = Path(path)
    if not p.exists():
        raise missing_path(p)
    files = job_files(p, live=live) if p.is_dir() else [p]
    for _, view in read_all(files, "rank", jobs=jobs, digest=digest):
        if isinstance(view, DumpError):
            raise view
        yield view


# ---------------------------------------------------------------------------- parallel reads

Kind = Literal["rank", "read"]
# below this many bytes of dumps, starting worker processes costs more than it saves (measured by
# bench/ranks_scale.py --break-even: a worker's start is ~0.15 s of CPU; one rank of 10,000 events
# (1.4 MB) takes ~25 ms to parse here and ~6 ms to receive from a worker)
PARALLEL_MIN_BYTES = 32 << 20
MAX_JOBS = 8


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the CPUs this process may run on (containers, taskset)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_jobs(files: list[Path]) -> int:
    """How many processes read `files` when ``-j`` is not given: one for a folder under
    :data:`PARALLEL_MIN_BYTES`, else one per CPU, at most :data:`MAX_JOBS`."""
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += f.stat().st_size
        if total >= PARALLEL_MIN_BYTES:
            return max(1, min(_cpus(), MAX_JOBS, len(files)))
    return 1


_FEW_GC = 100_000  # the collector's first threshold while a folder is read (the default is 700)


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """Fewer cyclic garbage collections while a folder is read: a rank's events are thousands of
    acyclic tuples, freed by reference counting, and with the default threshold (700) the
    collector walks them over and over (about a third of the time of ``check`` on a large
    folder). The old thresholds come back after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], _FEW_GC), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


_READERS: dict[str, Callable[[Path], Trace | RankView]] = {"rank": load_rank, "read": read}


def _read_one(kind: str, path: Path, digest: Callable[[Any], Any] | None) -> Any:
    """One file read by the `kind` reader, then through `digest` when given; its DumpError as
    the result when it cannot be read."""
    try:
        data = _READERS[kind](path)
    except DumpError as e:
        return e
    return data if digest is None else digest(data)


def _pack(kind: str, path: Path, digest: Callable[[Any], Any] | None = None) -> bytes:
    """In a worker: read one file and pickle it (or its `digest`) for the parent, its events as
    plain tuples (a named tuple unpickles through a Python call per event, four times slower than
    the parse)."""
    data = _read_one(kind, path, digest)
    if isinstance(data, (Trace, RankView)):
        data.events = cast(Any, [tuple(e) for e in data.events])
    return pickle.dumps(data, pickle.HIGHEST_PROTOCOL)


_event = partial(tuple.__new__, CollectiveEvent)


def _unpack(blob: bytes) -> Any:
    data = pickle.loads(blob)
    if isinstance(data, Trace):
        data.events = deque(map(_event, data.events), maxlen=data.max_events)
    elif isinstance(data, RankView):
        data.events = list(map(_event, data.events))
    return data


def _worker_start() -> None:
    gc.set_threshold(_FEW_GC, *gc.get_threshold()[1:])


def read_all(files: Iterable[Path], kind: Kind = "rank", *, jobs: int | None = None,
             digest: Callable[[Any], Any] | None = None) -> Iterator[tuple[Path, Any]]:
    """Each file read by :func:`load_rank` (``kind="rank"``) or :func:`read` (``"read"``), in
    the order given, as ``(path, result)``; a file that cannot be read gives its
    :class:`DumpError` as the result (the caller decides: stop, or name it and go on).

    ``digest``: a module-level function (workers import it by name) applied to each file's
    Trace or RankView where it was read, its result given instead: an analysis's per-rank share
    (``check``'s :func:`~commdebug.analysis.check.rank_digest`), so a worker hands back a few
    arrays, not ten thousand events. The same function runs in this process with one job, so
    the results do not depend on ``jobs``.

    ``jobs`` processes read (None: :func:`default_jobs`). With more than one, files are parsed
    in worker processes started with the ``spawn`` method: a fresh interpreter that imports the
    readers alone, so it never holds torch (a program that recorded and then reads a folder
    does not copy its memory and threads into the workers, as ``fork`` would), and it works
    the same on Linux, macOS and Windows. At most ``2 x jobs`` files are in flight, so memory
    stays bounded whatever the folder's size, and a slow consumer never piles results up.

    >>> for path, view in read_all(job_files("traces/"), jobs=2):   # doctest: +SKIP
    ...     print(path.name, view.rank)
    """
    files = list(files)
    n = default_jobs(files) if jobs is None else max(1, jobs)
    n = min(n, len(files))
    with _few_collections():
        if n <= 1:
            for f in files:
                yield f, _read_one(kind, f, digest)
            return
        import multiprocessing  # the pool's modules load only when a folder is read in parallel
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start) as pool:
            window: deque[tuple[Path, Future[bytes]]] = deque()
            todo = iter(files)
            for f in todo:
                window.append((f, pool.submit(_pack, kind, f, digest)))
                if len(window) >= 2 * n:
                    break
            while window:
                f, future = window.popleft()
                try:
                    blob = future.result()
                except BrokenProcessPool:  # killed (out of memory, a signal): one line, not a traceback
                    raise DumpError(f"{f}: a worker process reading the folder died before it was read "
                                    f"(out of memory, or killed); read with fewer processes: -j 1") from None
                for nxt in todo:  # keep the workers busy while this one is handed on
                    window.append((nxt, pool.submit(_pack, kind, nxt, digest)))
                    break
                result = _unpack(blob)
                del blob
                yield f, result


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
    if raw[:1] == _PICKLE:
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

