"""The events of a torch.profiler (Kineto) Chrome trace that commdebug needs, read fast.

A GPU trace of a few training steps is tens of megabytes of JSON and over a hundred thousand
events, most of which say nothing about communication: flow arrows, CPU ops, CUDA runtime calls.
Making Python objects of every one of them is most of what reading costs (HolisticTraceAnalysis
spends seconds there; orjson alone half a second on a 35 MB trace). :func:`read_events` keeps:

- every GPU activity (an ``"X"`` event whose ``args`` has a ``stream``): kernels, memcpys,
  memsets;
- the CPU events whose name holds one of :data:`KEEP_NAMES`: every spelling of a collective
  (``record_param_comms``, ``nccl:*`` and ``gloo:*`` annotations, ``c10d::*`` and the
  functional collectives' ops), ``ProfilerStep#N`` spans and the spans that tell a call's phase;
  on a CPU-only trace (gloo) every CPU event, since its CPU ops are the compute;
- of each CUDA runtime or driver call only its correlation id, time and thread
  (:attr:`KinetoEvents.launches`), which tell when a GPU activity was launched and from where;
- the thread names and the document's other top-level keys (``distributedInfo``, ...).

Where the optional C module :mod:`commdebug.formats._kineto` is built, a GPU trace is read in one
pass over its bytes: it checks that the document is JSON as it goes, makes Python objects of the
events kept alone (those ``json.loads`` would make of them), and takes each launch's three
numbers without making its event. Where it is not built, or where the pass meets what it does
not read (a document that is not strict JSON, a key written with escapes, a launch whose fields
are not plain numbers, an integer past 64 bits), the whole document is parsed. Both give the
same events: :func:`_sort` makes the choice either way, the C pass only leaves out events it
would drop (tests/test_kineto_reader.py compares them).

    >>> events = read_events(raw, Path("rank0.pt.trace.json"))   # doctest: +SKIP
    >>> len(events.gpu), len(events.cpu), events.header["distributedInfo"]["rank"]
"""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any

from commdebug.errors import DumpError
from commdebug.formats.fast_json import loads

__all__ = ["KinetoEvents", "read_events", "is_profiler_trace", "KEEP_NAMES"]

_kineto: Any
try:
    from commdebug.formats import _kineto
except ImportError:  # optional at install: every event is parsed instead, to the same result
    _kineto = None

# a CPU event of a GPU trace is kept when its name holds one of these (the profiler reader's
# spellings of a collective, and its steps and phases); a spelling it learns goes here
KEEP_NAMES: tuple[str, ...] = (
    "record_param_comms", "c10d", "nccl:", "gloo:",  # c10d: c10d::* and _c10d_functional::* ops
    "ProfilerStep#", "Optimizer.step#", "autograd::engine::evaluate_function", "FSDP::",
)
_MARKERS = tuple(name.encode() for name in KEEP_NAMES)
_holds_a_name = re.compile("|".join(map(re.escape, KEEP_NAMES))).search
_RUNTIME = ("cuda_runtime", "cuda_driver", "privateuse1_runtime")  # the calls that launch GPU activities
_EVENTS_KEY = b'"traceEvents"'


class KinetoEvents:
    """What :func:`read_events` keeps of a trace: the top-level keys other than the events
    (``distributedInfo``, ...), the GPU activities and the CPU events that can matter, as the
    trace's dicts (``"ph": "X"``), in the trace's order; the CUDA launches (correlation id ->
    (time, thread)); the thread names."""

    __slots__ = ("header", "gpu", "cpu", "launches", "thread_names")

    def __init__(self, header: dict[str, Any], launches: dict[int, tuple[float, Any]] | None = None) -> None:
        self.header = header
        self.gpu: list[dict[str, Any]] = []
        self.cpu: list[dict[str, Any]] = []
        self.launches: dict[int, tuple[float, Any]] = {} if launches is None else launches
        self.thread_names: dict[Any, str] = {}

    def launch(self, correlation: int) -> tuple[float, Any] | None:
        """(time, thread) of the CUDA call that launched a GPU activity, or None."""
        return self.launches.get(correlation)


def is_profiler_trace(raw: bytes) -> bool:
    """Whether a file's (decompressed) bytes are a Chrome trace: a JSON object with a
    ``traceEvents`` array (told without parsing; commdebug's own dumps start with ``"fqn"``)."""
    head = raw[:64].lstrip()
    return head[:1] == b"{" and not head[1:].lstrip().startswith(b'"fqn"') and raw.find(_EVENTS_KEY) != -1


def read_events(raw: bytes, path: Path) -> KinetoEvents:
    """The events of a trace that matter (see the module docstring), or a :class:`DumpError`
    naming the file: a truncated trace, a JSON document that is no trace."""
    key = raw.find(_EVENTS_KEY)
    if key == -1 or raw.find(b"[", key) == -1:
        raise DumpError(f"{path}: not a torch.profiler trace (no 'traceEvents' array)")
    # tens of thousands of new dicts, none in a cycle: while they are made, the collector would
    # walk them, and every other object of the process, again and again
    collecting = gc.isenabled()
    gc.disable()
    try:
        if _kineto is not None and type(raw) is bytes:  # the C pass reads a bytes object's buffer alone
            found = _kineto.scan(raw, _MARKERS)
            if found is not None and found[1]:  # read, and a GPU trace (a CPU trace's CPU events are all kept)
                header, gpu, others, launches = found
                return _sort(header, others, launches, gpu)
        return _whole(raw, path)
    finally:
        if collecting:
            gc.enable()


def _whole(raw: bytes, path: Path) -> KinetoEvents:
    """Every event parsed, then sorted."""
    try:
        data = loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise DumpError(f"{path}: not a complete torch.profiler trace (cut short or not JSON: {error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise DumpError(f"{path}: not a torch.profiler trace (no 'traceEvents' array)")
    return _sort({k: v for k, v in data.items() if k != "traceEvents"}, data["traceEvents"], {})


def _sort(header: dict[str, Any], events: list[Any], launches: dict[int, tuple[float, Any]],
          gpu: list[dict[str, Any]] | None = None) -> KinetoEvents:
    """The events kept (module docstring), from the parsed events: the whole trace's, or those
    the C pass kept (it reads the launches itself, into ``launches``, and hands the GPU
    activities, told by the test below, apart in ``gpu``)."""
    out = KinetoEvents(header, launches)
    if gpu is not None:
        out.gpu = gpu
    gpu, cpu, thread_names = out.gpu, out.cpu, out.thread_names
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M":
            tid = e.get("tid")
            if e.get("name") == "thread_name" and tid.__hash__ is not None:
                args = e.get("args")
                thread_names[tid] = str(args.get("name", "") if isinstance(args, dict) else "")
            continue
        if ph != "X":
            continue
        args = e.get("args")
        if isinstance(args, dict) and "stream" in args:
            gpu.append(e)
        elif e.get("cat") in _RUNTIME:
            if isinstance(args, dict) and "correlation" in args:
                try:
                    launches[int(args["correlation"])] = (float(e.get("ts", 0.0)), e.get("tid"))
                except (TypeError, ValueError, OverflowError):
                    pass  # no number: a launch that cannot be placed
        else:
            cpu.append(e)
    if gpu:  # a GPU trace: its compute is its kernels, and of its CPU events only the named ones matter
        out.cpu = [e for e in cpu if _named(e)]
    return out


def _named(event: dict[str, Any]) -> bool:
    name = event.get("name", "")
    return _holds_a_name(name if type(name) is str else str(name)) is not None
