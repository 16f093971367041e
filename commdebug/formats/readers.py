"""Every file commdebug reads comes in here: one rank's dump, a folder of them, ours or PyTorch
Flight Recorder's, each told by its content.

- :func:`load` gives a :class:`~commdebug.model.trace.Trace` (our dump, or torch's
  CommDebugMode's) with the module tree: what ``table``, ``summary`` and the viewer show.
- :func:`load_rank` gives a :class:`~commdebug.model.rank_view.RankView` (events and groups,
  no tree) of our dump or a Flight Recorder one: what ``check``, ``report`` and ``trace`` read.
- :func:`read` gives whichever of the two the file holds: a Trace for our dumps, a RankView
  for Flight Recorder's.
- :func:`iter_ranks` walks a job (a folder, a folder of per-node folders, several folders, or
  one file) a rank at a time, and :func:`read_all` reads a list of files with either reader, in
  parallel worker processes when it pays (``-j``: :func:`default_jobs`), giving results in file
  order. Which files make a job is :mod:`commdebug.formats.folders`' business
  (:func:`job_files`: one file per rank, in rank order, one run only).

A rank's fault record (``rank<R>.fault``, written when a fatal signal ended its process:
:mod:`commdebug.model.fault`) is read with its dump or stream, into ``metadata.fault``, where
its pid and run id are the rank's.

A rank's stream (``rank<R>.jsonl``, written while the program runs: docs/streaming.md) is read
by all of them, up to a torn last chunk (said in a note).

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
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from commdebug.errors import DumpError, empty_file, missing_path
from commdebug.formats.faults import with_fault
from commdebug.formats.flight_recorder import from_flight_recorder, is_flight_recorder
from commdebug.formats.folders import PICKLE, Dumps, dump_files, job_files, rank_files, rank_from_name, run_id_of
from commdebug.formats.kineto import is_profiler_trace
from commdebug.formats.profile_files import trace_rank
from commdebug.formats.profile_join import attach_profile, profile_path_for
from commdebug.formats.profiler import profile_view, read_profile
from commdebug.model.aggregates import older_of, set_older
from commdebug.model.dump import from_dump_dict, rank_view_from_dump_dict
from commdebug.model.profile import Profile
from commdebug.model.rank_view import RankView, trace_of_view
from commdebug.model.stream import is_stream, parse_stream, stream_rank_view, stream_trace
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
    if raw[:1] == PICKLE:
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


def iter_ranks(path: Dumps, *, live: bool = False, jobs: int | None = 1,
               digest: Callable[[RankView], Any] | None = None) -> Iterator[Any]:
    """Each rank of a job (a folder, a folder of per-node folders, several folders, or the one
    dump a file is: :func:`~commdebug.formats.folders.dump_files`), in rank order, as a
    RankView or its `digest` (see :func:`read_all`); ``live``: a rank's stream where it is newer
    than its dump; ``jobs``: processes reading (None: :func:`default_jobs`)."""
    files = dump_files(path, live=live)
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


