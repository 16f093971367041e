"""The events of a torch.profiler (Kineto) Chrome trace that commdebug needs, read fast.

A GPU trace of one training step holds tens of thousands of events, most of which say nothing
about communication: flow arrows, CPU ops, CUDA runtime calls. Parsing every one of them into
Python objects is most of what reading costs (HolisticTraceAnalysis spends seconds there). This
module splits the ``traceEvents`` array into one byte string per event, at the separator
between events, and parses only those that can matter (found by a few byte searches, in C):

- GPU activities (events with a ``stream``): kernels, memcpys, memsets;
- collective calls (``record_param_comms``, ``nccl:*`` annotations, ``c10d::*`` and the
  functional collectives' ops, ``gloo:*`` spans) and ``ProfilerStep#N`` spans;
- the spans that tell a call's phase (``Optimizer.step#*``, ``autograd::engine::evaluate_function``,
  FSDP's ``FSDP::*`` hooks);
- of CUDA runtime and driver calls only the launch time, thread and correlation id of each GPU
  activity's launch (by a regular expression, looked for just after the activity), which tell
  when it was launched.

Splitting is safe because a JSON string never holds a raw newline: the separator ``},\\n{``
(with the writer's indentation) cannot occur inside a name. It is checked where it matters: every
piece read must parse as one event, else (a trace written on one line, another writer's layout)
the whole document is parsed with orjson (or :mod:`json`); and a GPU activity whose launch is not
right after it (where Kineto writes it) has every launch of the trace read, in any layout. A
CPU-only trace is parsed whole: its CPU ops are the compute.

    >>> events = read_events(raw, Path("rank0.pt.trace.json"))   # doctest: +SKIP
    >>> len(events.gpu), len(events.cpu), events.header["distributedInfo"]["rank"]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.errors import DumpError

__all__ = ["KinetoEvents", "read_events", "is_profiler_trace", "COMM_MARKERS"]

_orjson: Any
try:
    import orjson as _orjson
except ImportError:  # optional: json reads the same
    _orjson = None

_EVENTS_KEY = b'"traceEvents"'
# the separator between two events of the array: the end of one, a comma, white space holding a
# newline (never inside a JSON string), the start of the next
_SEPARATOR = re.compile(rb"\}[ \t\r]*,[ \t\r]*\n\s*\{")
# names that make a CPU event worth parsing in a GPU trace (byte searches)
# (one search of the whole trace each: "c10d" finds c10d::* and the functional collectives' ops)
COMM_MARKERS = (b"record_param_comms", b"c10d", b"nccl:")
_STEP_MARKERS = (b"ProfilerStep#", b"Optimizer.step#", b"autograd::engine::evaluate_function", b"FSDP::")
# the same, as the start of an event's name: one pass finds them all
_NAMES = re.compile(rb'"name"\s*:\s*"(?:record_param_comms|_?c10d|nccl:|gloo:|ProfilerStep#|Optimizer\.step#|'
                    rb'autograd::engine::evaluate_function|FSDP::)')
_RUNTIME = (b'"cuda_runtime"', b'"cuda_driver"')
_NEAR = 4096  # bytes after a GPU activity its launch is looked for in
_TS = re.compile(rb'"ts"\s*:\s*(-?[0-9][0-9.eE+-]*)')
_TID = re.compile(rb'"tid"\s*:\s*(-?[0-9]+)')
_CORRELATION = re.compile(rb'"correlation"\s*:\s*(-?[0-9]+)')
# a CUDA runtime or driver call's thread, time and correlation id: as Kineto lays the event out
# (fast: no backtracking), and in any layout with the fields in Kineto's order
_LAUNCH_PATTERNS = (
    re.compile(rb'cuda_(?:runtime|driver)", "name": "[^"]*", "pid": -?[0-9]+, "tid": (-?[0-9]+),\n    "ts": (-?[0-9][0-9.]*), '
               rb'"dur": [0-9.]+,\n    "args": \{\n      "External id": -?[0-9]+,\s*"cbid": [0-9]+, "correlation": (-?[0-9]+)'),
    re.compile(rb'cuda_(?:runtime|driver)"\s*,\s*"name"\s*:\s*"[^"]*"\s*,\s*"pid"\s*:\s*[^,]*,\s*'
                       rb'"tid"\s*:\s*(-?[0-9]+)\s*,\s*"ts"\s*:\s*(-?[0-9][0-9.eE+-]*)[^{}]*\{[^{}]*?"correlation"\s*:\s*(-?[0-9]+)'),
)


@dataclass
class KinetoEvents:
    """What :func:`read_events` keeps of a trace: the top-level keys other than the events
    (``distributedInfo``, ...), the GPU activities and the CPU events that can matter, as dicts,
    each with ``"ph": "X"``; the CUDA launches (correlation id -> (time, thread)); the thread
    names."""

    header: dict[str, Any]
    gpu: list[dict[str, Any]] = field(default_factory=list)
    cpu: list[dict[str, Any]] = field(default_factory=list)
    launches: dict[int, tuple[float, Any]] = field(default_factory=dict)
    thread_names: dict[Any, str] = field(default_factory=dict)
    # reads the launches the first pass may have missed (another layout); None: all were read
    complete_launches: Callable[[], None] | None = None

    def launch(self, correlation: int) -> tuple[float, Any] | None:
        """(time, thread) of the CUDA call that launched a GPU activity, or None."""
        found = self.launches.get(correlation)
        if found is None and self.complete_launches is not None:
            complete, self.complete_launches = self.complete_launches, None
            complete()
            found = self.launches.get(correlation)
        return found


def is_profiler_trace(raw: bytes) -> bool:
    """Whether a file's (decompressed) bytes are a Chrome trace: a JSON object with a
    ``traceEvents`` array (told without parsing; commdebug's own dumps start with ``"fqn"``)."""
    head = raw[:64].lstrip()
    return head[:1] == b"{" and not head[1:].lstrip().startswith(b'"fqn"') and raw.find(_EVENTS_KEY) != -1


def _loads(raw: bytes | str) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # json says what is wrong, or reads what orjson does not (NaN)
    return json.loads(raw)


def read_events(raw: bytes, path: Path) -> KinetoEvents:
    """The events of a trace that matter (see the module docstring), or a :class:`DumpError`
    naming the file: a truncated trace, a JSON document that is no trace."""
    key = raw.find(_EVENTS_KEY)
    start = raw.find(b"[", key) + 1 if key != -1 else 0
    if key == -1 or start == 0:
        raise DumpError(f"{path}: not a torch.profiler trace (no 'traceEvents' array)")
    if raw.find(b'"stream"', start) != -1:  # a GPU trace: the fast path, if the writer's layout allows
        found = _split(raw, start, path)
        if found is not None:
            return found
    return _whole(raw, path)


def _whole(raw: bytes, path: Path) -> KinetoEvents:
    """Every event parsed (a CPU trace, or a layout the splitter does not know)."""
    try:
        data = _loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise DumpError(f"{path}: not a complete torch.profiler trace (cut short or not JSON: {error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise DumpError(f"{path}: not a torch.profiler trace (no 'traceEvents' array)")
    header = {k: v for k, v in data.items() if k != "traceEvents"}
    out = KinetoEvents(header)
    gpu_trace = False
    for e in data["traceEvents"]:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                out.thread_names[e.get("tid")] = str((e.get("args") or {}).get("name", ""))
            continue
        if ph != "X":
            continue
        args = e.get("args")
        if isinstance(args, dict) and "stream" in args:
            out.gpu.append(e)
            gpu_trace = True
        elif e.get("cat") in ("cuda_runtime", "cuda_driver", "privateuse1_runtime"):
            if isinstance(args, dict) and "correlation" in args:
                out.launches[int(args["correlation"])] = (float(e.get("ts", 0.0)), e.get("tid"))
        else:
            out.cpu.append(e)
    if gpu_trace:  # on a GPU trace only the CPU events the fast path keeps matter
        markers = tuple(m.decode() for m in COMM_MARKERS + _STEP_MARKERS)
        out.cpu = [e for e in out.cpu if any(m in str(e.get("name", "")) for m in markers)]
    return out


def _split(raw: bytes, start: int, path: Path) -> KinetoEvents | None:
    """The fast path: None when the trace's layout does not split cleanly."""
    first = _SEPARATOR.search(raw, start)
    if first is None:
        return None
    separator = first.group(0)
    step = len(separator)
    end_of_events = len(raw)

    def piece(i: int) -> tuple[int, int]:
        """The bounds of the event holding position i (its braces cut, but the first's opening
        and the last's closing one)."""
        a = raw.rfind(separator, start, i)
        b = raw.find(separator, i)
        return (start if a == -1 else a + step), (end_of_events if b == -1 else b)

    def where(marker: bytes) -> dict[int, int]:
        found: dict[int, int] = {}
        i = raw.find(marker, start)
        while i != -1:
            a, b = piece(i)
            found[a] = b
            i = raw.find(marker, b)  # the next event on
        return found

    # a trace cut short (a killed writer, a partial copy) must not read as a shorter one: the last
    # event and the end of the document are checked whatever the markers find
    last = raw.rfind(separator, start)
    if last == -1 or not raw.rstrip().endswith(b"}") or _event(raw[last + step:], False, True) is None:
        return None  # the whole parse says what is wrong
    header = _header(raw, start, path)
    out = KinetoEvents(header)
    # GPU activities but memory copies and sets (they are neither communication nor compute; told
    # by the category Kineto writes first, their names all Memcpy/Memset)
    gpu = [(a, b) for a, b in sorted(where(b'"stream"').items()) if raw.find(b'"gpu_mem', a, a + 64) == -1]
    found = _events(raw, gpu, start, end_of_events)
    if found is None:
        return None
    out.gpu = [e for e in found if e.get("ph") == "X"]
    # Kineto writes each GPU activity's CUDA launch right after it: looked for there first, and
    # only what is not found is read from the whole trace (complete_launches, below)
    launches = out.launches
    near = _LAUNCH_PATTERNS[0].search
    for e, (_, b) in zip(found, gpu, strict=True):
        corr = (e.get("args") or {}).get("correlation")
        m = near(raw, b, b + _NEAR)
        if m is not None and type(corr) is int and int(m.group(3)) == corr:
            launches[corr] = (float(m.group(2)), int(m.group(1)))
    wanted: dict[int, int] = {}
    for m in _NAMES.finditer(raw, start):
        a, b = piece(m.start())
        wanted[a] = b
    found = _events(raw, sorted(wanted.items()), start, end_of_events)
    if found is None:
        return None
    out.cpu = [e for e in found if e.get("ph") == "X" and not isinstance((e.get("args") or {}).get("stream"), (int, str))]

    def complete() -> None:  # a GPU activity's launch was not beside it: every launch of the trace
        _add_launches(launches, _LAUNCH_PATTERNS[0].findall(raw, start))
        _add_launches(launches, _LAUNCH_PATTERNS[1].findall(raw, start))
        for marker in _RUNTIME:
            for a, b in where(marker).items():
                corr, ts, tid = _CORRELATION.search(raw, a, b), _TS.search(raw, a, b), _TID.search(raw, a, b)
                if corr is not None and ts is not None:
                    launches.setdefault(int(corr.group(1)), (float(ts.group(1)), int(tid.group(1)) if tid is not None else None))

    out.complete_launches = complete
    return out


def _add_launches(launches: dict[int, tuple[float, Any]], found: list[tuple[bytes, bytes, bytes]]) -> None:
    """(tid, ts, correlation) matches into ``launches`` (those not there yet)."""
    for tid, ts, corr in found:
        launches.setdefault(int(corr), (float(ts), int(tid)))


def _events(raw: bytes, bounds: list[tuple[int, int]], start: int, end: int) -> list[dict[str, Any]] | None:
    """The events at ``bounds`` (pieces of ``raw``), parsed in one call where they are in the
    middle of the array (thousands of calls cost more than the parse); None when one does not
    parse as an event."""
    inner = [raw[a:b] for a, b in bounds if a != start and b != end]
    try:
        found = _loads(b"[{" + b"},{".join(inner) + b"}]") if inner else []
    except ValueError:
        return None
    if not isinstance(found, list) or len(found) != len(inner) or not all(isinstance(e, dict) for e in found):
        return None
    for k, (a, b) in enumerate(bounds):  # the first and the last piece of the array keep one of their braces
        if a == start or b == end:
            e = _event(raw[a:b], a == start, b == end)
            if e is None:
                return None
            found.insert(k, e)
    return found


def _event(piece: bytes, first: bool, last: bool) -> dict[str, Any] | None:
    """One event's piece parsed; None when it does not parse."""
    if first:
        piece = piece.lstrip()
        piece = piece[1:] if piece[:1] == b"{" else piece
    if last:  # the event, its closing brace, then the end of the array and the document
        try:
            value, _ = json.JSONDecoder().raw_decode((b"{" + piece).decode("utf-8", "replace"))
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    try:
        value = _loads(b"{" + piece + b"}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _header(raw: bytes, events_at: int, path: Path) -> dict[str, Any]:
    """The document's top-level keys before ``traceEvents`` (Kineto writes ``distributedInfo``
    and ``deviceProperties`` there), parsed from the head alone."""
    head = raw[:raw.rfind(_EVENTS_KEY, 0, events_at)].rstrip()
    text = head.decode("utf-8", "replace").rstrip().rstrip(",")
    try:
        value = _loads(text + "}")
    except ValueError:
        return {}  # an odd head: the events are what matter; metadata comes from the name
    return value if isinstance(value, dict) else {}
