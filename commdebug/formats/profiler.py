"""torch.profiler (Kineto) Chrome traces as commdebug data: one rank's :class:`Profile` (when
communication and compute ran) and its collectives as events, so ``check``, ``report``,
``overlap`` and the rest read a profiler trace as they read a dump.

What a trace says about a collective depends on its backend and vintage, and this reader takes
each call from the richest record it has:

- ``record_param_comms`` (torch 2.x on NCCL): op (``"Collective name"``), dtype, element counts,
  all_to_all split sizes, group (name, description, ranks, size), ``"Seq"`` (torch counts from
  1; shifted to ours, from 0), p2p peer; its GPU kernel (the one sharing its ``External id``, else
  the one whose CUDA launch lies inside the call) gives the latency, NCCL's own time;
- ``nccl:<op>`` annotations (older NCCL traces, no args): op only, sizes from the enclosing
  ``c10d::*`` op's ``Input Dims`` where shapes were recorded;
- ``c10d::*`` (and functional collective) ops (gloo, which writes no ``record_param_comms``):
  op and sizes from the op's inputs (by the op registry's argument positions); the work is a
  ``gloo:<op>`` span on a gloo thread, matched to the earliest call of the same op (and shape)
  issued before it, which gives the latency.

A group the trace does not name is left unknown (``"?"``), never guessed, but where
``distributedInfo`` lists one group only; without ``"Seq"`` a known group's calls are numbered
in their order in the trace. A call's step is the ``ProfilerStep#N`` it lies in; its phase is
``optimizer`` inside ``Optimizer.step#*``, ``backward`` inside an autograd engine function, else
``forward`` (as commdebug's own capture counts). What is left unknown is said once, in a note.

Activities follow HolisticTraceAnalysis 0.5.0 (``hta/utils/utils.py``), so the two agree: GPU
activities are the events with a ``stream``; communication is ``^nccl.*Kernel``, memory
``^Memcpy|^Memset|^dma``, compute what is neither those nor ``.*Memcpy``, ``Memset`` or
``.*Sync``. On a CPU trace, communication is the ``gloo:*`` spans and compute the CPU ops of
the program's threads minus the collective calls (and the waits) they hold.

    >>> profile = read_profile(raw, Path("traces/rank0.pt.trace.json"), lambda: None)   # doctest: +SKIP
    >>> view = profile_view(profile)                                                      # doctest: +SKIP
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.formats.flight_recorder import C10_DTYPES
from commdebug.formats.kineto import KinetoEvents, read_events
from commdebug.formats.trace_spans import (
    KINDS,
    CallsAt,
    Enclosing,
    ThreadSpans,
    as_int,
    as_int_list,
    cut,
    kernel_kind,
    outermost,
    span,
)
from commdebug.model.profile import Activities, Profile, ProfileStep
from commdebug.model.rank_view import RankView
from commdebug.model.trace import BACKWARD, FORWARD, OPTIMIZER, UNKNOWN_GROUP, CollectiveEvent, GroupInfo

__all__ = ["read_profile", "profile_view", "rank_in_name", "FORMAT"]

FORMAT = "torch-profiler"  # RankView.source_format of a view read from a profiler trace

# record_param_comms entries that are no collective the program issued
_NOT_CALLS = frozenset({"wait", "init", "coalesced", "startCoalescing", "endCoalescing", ""})
_STEP = re.compile(r"^ProfilerStep#(\d+)")
# the spans gloo runs a call as, where they are another op's (ProcessGroupGloo's reduce_scatter
# of one tensor is an all_reduce, its result copied out)
_GLOO_RUNS_AS = {"reduce_scatter": ("all_reduce",)}
# ops whose input and output are the same tensors: a gloo span's input dims give both
_SAME_SIZE = frozenset({"all_reduce", "broadcast", "reduce", "send", "recv"})
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
# torch.profiler's "Input type" names -> (dtype, bytes per element)
_INPUT_TYPES = {
    "float": ("float32", 4), "double": ("float64", 8), "c10::Half": ("float16", 2), "c10::BFloat16": ("bfloat16", 2),
    "long int": ("int64", 8), "int": ("int32", 4), "short int": ("int16", 2), "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1), "bool": ("bool", 1), "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16), "c10::Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e5m2": ("float8_e5m2", 1),
}


def rank_in_name(name: str) -> int | None:
    """The rank a trace file's name gives (``rank3.pt.trace.json``, ``trace_rank-3.json.gz``), or None."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def read_profile(raw: bytes, path: Path, rank_from_name: Callable[[], int | None]) -> Profile:
    """A trace's (decompressed) bytes as a :class:`Profile`; the rank from ``distributedInfo``,
    else from ``rank_from_name()``, else a :class:`DumpError` saying why."""
    events = read_events(raw, path)
    info = events.header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank")
    if not isinstance(rank, int):
        rank = rank_from_name()
        if rank is None:
            raise DumpError(f"{path}: a torch.profiler trace that names no rank: it has no distributedInfo (written before "
                            "torch.distributed was initialised) and no 'rank<N>' in its file name (torch's default name, "
                            "host_pid.<ms>.pt.trace.json, holds none); rename it rank<N>.pt.trace.json")
    try:
        return _Builder(events, path, rank, info).profile()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise DumpError(f"{path}: malformed torch.profiler trace ({type(e).__name__}: {e})") from None


def profile_view(profile: Profile) -> RankView:
    """A profile's collectives as a :class:`RankView`, the profile attached."""
    groups = {e.group.name: e.group for e in profile.calls if e.group.name != "?"}
    steps = [s.number for s in profile.steps]
    seconds = (profile.steps[-1].end - profile.steps[0].start) / 1e6 if profile.steps else None
    meta: dict[str, Any] = {
        "rank": profile.rank, "world_size": profile.world_size, "backend": profile.backend, "hostname": profile.hostname,
        "format": FORMAT, "timing": "profiler", "steps": (max(steps) + 1) if steps else 0,
        "elapsed_s": seconds, "recorded_s": seconds, "profile_steps": [min(steps), max(steps)] if steps else None,
    }
    view = RankView(int(profile.rank or 0), profile.path, meta, groups, list(profile.calls), source_format=FORMAT,
                    notes=list(profile.notes), profile=profile)
    return view


def _dispatcher_spec(name: str) -> _ops.CollectiveSpec | None:
    """The registry row of a dispatcher op the profiler names ``ns::name`` (``c10d::allreduce_``)."""
    if "::" not in name:
        return None
    spec = _ops.capture_spec(name.replace("::", ".", 1))
    return spec if isinstance(spec, _ops.CollectiveSpec) else None


def _collective_op(name: str) -> str | None:
    """A collective's canonical op from a name other tools give it."""
    return _ops.canonical_op(name, "profiler") or _ops.canonical_op(name, "flight_recorder")


class _Builder:
    """One pass over a trace's events that matter, into a Profile."""

    def __init__(self, events: KinetoEvents, path: Path, rank: int, info: dict[str, Any]) -> None:
        self.ev, self.path, self.rank, self.info = events, path, rank, info
        self.notes: list[str] = []
        self.groups: dict[str, GroupInfo] = {}
        for cfg in info.get("pg_config") or []:
            if isinstance(cfg, dict) and cfg.get("pg_name") is not None:
                name = str(cfg["pg_name"])
                ranks = as_int_list(cfg.get("ranks"))
                size = as_int(cfg.get("pg_size")) or (len(ranks) if ranks else 0)
                self.groups[name] = GroupInfo(name, str(cfg.get("pg_desc") or ""), size, tuple(ranks) if ranks else None)
        self.fractional = False
        self.unsized: set[int] = set()  # calls whose sizes the trace does not give
        self.gloo: list[dict[str, Any]] = []  # gloo's spans, in the order of the comm activities
        self.call_external: dict[Any, int] = {}  # a call record's External id -> the call

    def profile(self) -> Profile:
        ev = self.ev
        device = "gpu" if ev.gpu else "cpu"
        steps = self._steps()
        records = self._records()
        calls, spans = self._calls(records, steps)
        comm, compute, names = (self._gpu_activities(spans) if device == "gpu" else self._cpu_activities(records, spans))
        calls = self._timed(calls, comm)
        if self.unsized:
            n = len(self.unsized)
            self.notes.append(f"{n} collective{'s' if n != 1 else ''} of unknown size (the trace was recorded without "
                              "record_shapes=True, or names no element type)")
        origin = steps[0].start if steps else min((c.start_s for c in calls if c.start_s is not None), default=0.0)
        calls = [c._replace(start_s=None if c.start_s is None else (c.start_s - origin) / 1e6) for c in calls]
        world = as_int(self.info.get("world_size"))
        backend = self.info.get("backend")
        host = ev.header.get("host_name") or ev.header.get("hostname")
        return Profile(self.path, self.rank, world, str(backend) if backend else None, device, steps, comm, compute, names,
                       calls, origin, str(host) if host else None, self.notes, fractional=self.fractional)

    # ---- steps and the records of collective calls ----------------------------------------

    def _steps(self) -> list[ProfileStep]:
        found: dict[int, ProfileStep] = {}
        for e in self.ev.cpu:
            m = _STEP.match(str(e.get("name", "")))
            if m and e.get("dur") is not None:
                start, end = span(e)
                found.setdefault(int(m.group(1)), ProfileStep(int(m.group(1)), start, end))
        return sorted(found.values(), key=lambda s: s.start)

    def _records(self) -> dict[str, list[dict[str, Any]]]:
        """The trace's CPU events by what they are: ``rpc`` (record_param_comms of a
        collective), ``annotation`` (``nccl:<op>``), ``op`` (collective dispatcher ops),
        ``gloo`` (gloo's work spans), ``optimizer`` and ``backward`` spans."""
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in self.ev.cpu:
            name = str(e.get("name", ""))
            if e.get("dur") is None or e.get("ts") is None:
                continue
            if name == "record_param_comms":
                if str((e.get("args") or {}).get("Collective name", "")) not in _NOT_CALLS:
                    out["rpc"].append(e)
            elif name.startswith("nccl:") and e.get("cat") not in ("kernel", "gpu_user_annotation"):  # the CPU's
                out["annotation"].append(e)
            elif name.startswith("gloo:"):
                out["gloo"].append(e)
            elif name.startswith("Optimizer.step#"):
                out["optimizer"].append(e)
            elif name.startswith("autograd::engine::evaluate_function"):
                out["backward"].append(e)
            elif _dispatcher_spec(name) is not None:
                out["op"].append(e)
            elif e.get("cat") == "cpu_op":
                out["cpu"].append(e)
        return out

    def _calls(self, records: dict[str, list[dict[str, Any]]],
               steps: list[ProfileStep]) -> tuple[list[CollectiveEvent], list[tuple[Any, float, float, int]]]:
        """The calls, in issue order, and each call's CPU span on its thread (tid, start, end, index)."""
        ops_outer = outermost(records["op"])
        if records["rpc"]:
            chosen, kind = records["rpc"], "rpc"
        elif records["annotation"]:
            chosen, kind = records["annotation"], "annotation"
            self.notes.append("the trace has no record_param_comms (torch before 2.1, or gloo): ops from the nccl:<op> "
                              "annotations, sizes from the enclosing c10d op where shapes were recorded, no process groups "
                              "unless distributedInfo lists one")
        else:
            chosen, kind = ops_outer, "op"
        chosen = sorted(chosen, key=lambda e: float(e["ts"]))
        optimizer = ThreadSpans((e.get("tid"), *span(e)) for e in records["optimizer"])
        backward = ThreadSpans((e.get("tid"), *span(e)) for e in records["backward"])
        enclosing = Enclosing(ops_outer) if kind == "annotation" else None
        calls: list[CollectiveEvent] = []
        spans: list[tuple[Any, float, float, int]] = []
        seq_of: dict[str, int] = defaultdict(int)
        p2p_of: dict[tuple[str, str, int | None], int] = defaultdict(int)
        no_group = 0
        step_starts = [s.start for s in steps]
        for e in chosen:
            start, end = span(e)
            tid = e.get("tid")
            self.fractional = self.fractional or start != int(start)
            if kind == "rpc":
                fields = self._from_rpc(e)
            else:
                op_event = enclosing.at(tid, start) if enclosing is not None else e
                fields = self._from_op(e, op_event, kind)
            if fields is None:
                continue
            op, group, in_bytes, out_bytes, dtype, shapes, splits, peer, seq = fields
            if group is UNKNOWN_GROUP:
                no_group += 1
            if in_bytes is None:
                self.unsized.add(len(calls))
            spec = _ops.spec_for_op(op)
            n = group.size or 1
            ib, ob = in_bytes or 0, out_bytes or 0
            size = _ops.MESSAGE_SIZE[spec.size](ib, ob, n) if spec is not None else ib
            p2p = op in ("send", "recv")
            p2p_seq = None
            if p2p:
                key = (group.name, op, peer)
                p2p_seq = p2p_of[key]
                p2p_of[key] += 1
                seq = None
            elif group is UNKNOWN_GROUP:
                seq = None
            elif seq is None:
                seq = seq_of[group.name]
                seq_of[group.name] += 1
            if steps:
                i = bisect_right(step_starts, start) - 1
                step = steps[max(i, 0)].number
            else:
                step = 0
            phase = OPTIMIZER if optimizer.covers(tid, start) else BACKWARD if backward.covers(tid, start) else FORWARD
            send, recv = splits
            spans.append((tid, start, end, len(calls)))
            ext = (e.get("args") or {}).get("External id")
            if ext is not None and kind == "rpc":  # the op NCCL's kernels are launched from
                self.call_external.setdefault(ext, len(calls))
            calls.append(CollectiveEvent(
                index=len(calls), op=op, key=f"profiler:{op}", aten_op=str(e.get("name")), step=step, phase=phase,
                module="?", group=group, seq=seq, dtype=dtype, input_shapes=shapes[0], output_shapes=shapes[1],
                input_bytes=ib, output_bytes=ob, size_bytes=size, busbw_factor=spec.busbw_factor(n) if spec else 0.0,
                peer=peer, p2p_seq=p2p_seq, start_s=start, send_splits=send, recv_splits=recv))
        if seq_of:
            self.notes.append("the trace records no sequence numbers: each group's calls are numbered in their order in the "
                              "trace (the ranks' traces must cover the same steps to be compared)")
        if no_group:
            self.notes.append(f"{no_group} collective{'s' if no_group != 1 else ''} name no process group (gloo's trace does not "
                              "record it): check cannot pair them across ranks; record with `commdebug run --profile-steps` to "
                              "join them to the dump")
        return calls, spans

    def _group(self, args: dict[str, Any]) -> GroupInfo:
        name = args.get("Process Group Name")
        if name is None:
            return next(iter(self.groups.values())) if len(self.groups) == 1 else UNKNOWN_GROUP
        name = str(name)
        known = self.groups.get(name)
        ranks = as_int_list(args.get("Process Group Ranks"))
        size = as_int(args.get("Group size")) or (known.size if known else 0) or (len(ranks) if ranks else 0)
        if ranks is None and known is not None:
            ranks = list(known.ranks) if known.ranks else None
        desc = str(args.get("Process Group Description") or (known.desc if known else ""))
        group = GroupInfo(name, desc, size, tuple(ranks) if ranks else None)
        self.groups.setdefault(name, group)
        return group

    def _from_rpc(self, e: dict[str, Any]) -> tuple[Any, ...] | None:
        args = e.get("args") or {}
        raw = str(args.get("Collective name", ""))
        op = _collective_op(raw) or raw
        group = self._group(args)
        dtype, esize = C10_DTYPES.get(str(args.get("dtype")), (None, 0))
        nin, nout = as_int(args.get("In msg nelems")), as_int(args.get("Out msg nelems"))
        in_bytes = None if nin is None or not esize else nin * esize
        out_bytes = None if nout is None or not esize else nout * esize
        splits: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        if op == "all_to_all" and in_bytes is not None and out_bytes is not None and group.size:
            splits = (_splits(as_int_list(args.get("In split size")), in_bytes, group.size),
                      _splits(as_int_list(args.get("Out split size")), out_bytes, group.size))
        peer = as_int(args.get("Dst Rank") if op == "send" else args.get("Src Rank")) if op in ("send", "recv") else None
        if peer is not None and group.ranks and 0 <= peer < len(group.ranks):
            peer = group.ranks[peer]
        seq = as_int(args.get("Seq"))
        return op, group, in_bytes, out_bytes, dtype, ((), ()), splits, peer, None if seq is None or seq < 1 else seq - 1

    def _from_op(self, e: dict[str, Any], op_event: dict[str, Any] | None, kind: str) -> tuple[Any, ...] | None:
        """A call from an ``nccl:`` annotation (op from its name, sizes from ``op_event``, its
        enclosing c10d op) or from a dispatcher op (``op_event`` is ``e``)."""
        name = str(e.get("name", ""))
        if kind == "annotation":
            op = _collective_op(name.split(":", 1)[1].split(" ", 1)[0])
            if op is None:
                return None
        else:
            spec0 = _dispatcher_spec(name)
            if spec0 is None:
                return None
            op = spec0.op
        group = self._group({})
        spec = _dispatcher_spec(str(op_event.get("name", ""))) if op_event is not None else None
        args = (op_event.get("args") or {}) if op_event is not None else {}
        dims, types = args.get("Input Dims"), args.get("Input type")
        in_bytes = out_bytes = None
        dtype = None
        shapes: tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]] = ((), ())
        if spec is not None and isinstance(dims, list):
            (in_bytes, in_shapes, dt_in), (out_bytes, out_shapes, dt_out) = (
                _arg_bytes(dims, types, spec.inputs), _arg_bytes(dims, types, spec.outputs))
            dtype = dt_in or dt_out
            shapes = (in_shapes, out_shapes)
            if spec.inputs is None:
                in_bytes = 0 if out_bytes is not None else None
            if spec.outputs is None:
                out_bytes = 0 if in_bytes is not None else None
        if spec is not None and spec.size == "zero":  # a barrier moves nothing, whatever the trace says
            in_bytes = out_bytes = 0
        splits: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        peer = None
        concrete = args.get("Concrete Inputs")
        if op in ("send", "recv") and spec is not None and spec.peer is not None and isinstance(concrete, list):
            peer = as_int(concrete[spec.peer]) if spec.peer < len(concrete) else None
            if peer is not None and group.ranks and 0 <= peer < len(group.ranks):
                peer = group.ranks[peer]
            elif group is UNKNOWN_GROUP:
                peer = None  # a rank within an unknown group
        return op, group, in_bytes, out_bytes, dtype, shapes, splits, peer, None

    # ---- activities ---------------------------------------------------------------------------

    def _gpu_activities(self, spans: list[tuple[Any, float, float, int]]) -> tuple[Activities, Activities, list[str]]:
        """GPU activities by HTA's kinds; each NCCL kernel tied to the call that launched it: the
        call record sharing its ``External id`` (the CPU op it was launched from), else the call
        whose CPU span holds its launch on the launching thread."""
        comm, compute = Activities(), Activities()
        names: list[str] = []
        name_ids: dict[str, int] = {}
        calls_at = CallsAt(spans)
        external = self.call_external
        launch_of = self.ev.launch
        nan = math.nan
        fractional = False
        for e in self.ev.gpu:  # tens of thousands: kept lean
            args = e.get("args") or {}
            stream = args.get("stream")
            if type(stream) is not int:
                stream = as_int(stream)
            dur, cat = e.get("dur"), e.get("cat")
            if stream is None or stream == -1 or dur is None or cat is None or cat == "Trace":
                continue
            start = float(e["ts"])
            end = start + dur
            fractional = fractional or start != int(start)
            corr = args.get("correlation")
            launch = launch_of(corr) if type(corr) is int and corr >= 0 else None
            at = launch[0] if launch is not None else nan
            name = e.get("name") or ""
            kind = KINDS.get(name) or kernel_kind(name)
            if kind == "compute":
                i = name_ids.get(name)
                if i is None:
                    i = name_ids[name] = len(names)
                    names.append(name)
                compute.add(start, end, at, i)
            elif kind == "comm":
                call = external.get(args.get("External id"), -1)
                if call < 0 and launch is not None:
                    call = calls_at.find(launch[1], launch[0])
                comm.add(start, end, at, call)
        self.fractional = self.fractional or fractional
        return comm, compute, names

    def _cpu_activities(self, records: dict[str, list[dict[str, Any]]],
                        spans: list[tuple[Any, float, float, int]]) -> tuple[Activities, Activities, list[str]]:
        """gloo's spans (communication), and the program threads' CPU ops outside the
        collective calls (compute), each cut around the calls and spans it holds."""
        comm, compute = Activities(), Activities()
        names: list[str] = []
        name_ids: dict[str, int] = {}
        gloo = self.gloo = sorted(records["gloo"], key=lambda e: float(e["ts"]))
        workers = {tid for tid, name in self.ev.thread_names.items() if "gloo" in name.lower()}
        for e in gloo:
            start, end = span(e)
            self.fractional = self.fractional or start != int(start)
            comm.add(start, end, start, -1)
        # the holes: collective calls (with their waits) and gloo's spans on the program's threads
        holes: dict[Any, list[tuple[float, float]]] = defaultdict(list)
        for tid, start, end, _ in spans:
            holes[tid].append((start, end))
        for e in records["op"] + records["gloo"]:
            holes[e.get("tid")].append(span(e))
        program = [e for e in records["cpu"] + records["backward"] + records["optimizer"] if e.get("tid") not in workers]
        for e in outermost(program):
            start, end = span(e)
            name = str(e.get("name", ""))
            for piece in cut((start, end), holes.get(e.get("tid"), ())):
                i = name_ids.get(name)
                if i is None:
                    i = name_ids[name] = len(names)
                    names.append(name)
                compute.add(piece[0], piece[1], piece[0], i)
        return comm, compute, names

    def _tie_gloo(self, calls: list[CollectiveEvent], comm: Activities) -> list[CollectiveEvent]:
        """Tie each gloo span to a call: the earliest call not yet tied, issued at or before the
        span starts, whose op gloo runs as the span's (gloo runs ``reduce_scatter_tensor`` as an
        all_reduce), preferring among the first few one whose input shape matches the span's
        (gloo runs a group's work in the order it was issued; a span carries the op it ran and
        its input's dims). A call whose size the c10d op did not give (a tensor list names no
        element type) takes its span's."""
        calls = list(calls)
        waiting = list(range(len(calls)))  # untied, in issue order
        for k, e in enumerate(self.gloo):
            op = _collective_op(str(e.get("name", "")).split(":", 1)[1].split(" ", 1)[0])
            if op is None:
                continue
            start = comm.start[k]
            args = e.get("args") or {}
            dims = args.get("Input Dims")
            shape = tuple(tuple(d) for d in dims if isinstance(d, list)) if isinstance(dims, list) else ()
            pick = None
            for j, ci in enumerate(waiting):
                c = calls[ci]
                if c.start_s is not None and c.start_s > start:
                    break
                if c.op != op and op not in _GLOO_RUNS_AS.get(c.op, ()):
                    continue
                if pick is None:
                    pick = j
                    if not shape:
                        break
                if shape and shape[:1] == c.input_shapes[:1]:
                    pick = j
                    break
            if pick is None:
                continue
            ci = waiting.pop(pick)
            comm.ref[k] = ci
            if ci in self.unsized and isinstance(dims, list) and op in _SAME_SIZE and calls[ci].op == op:
                nbytes, _, dtype = _arg_bytes(dims, args.get("Input type"), 0)
                spec = _ops.spec_for_op(op)
                if nbytes is not None and spec is not None:
                    c = calls[ci]
                    ib = nbytes if spec.inputs is not None else 0
                    ob = nbytes if spec.outputs is not None else 0
                    calls[ci] = c._replace(input_bytes=ib, output_bytes=ob, dtype=dtype,
                                           size_bytes=_ops.MESSAGE_SIZE[spec.size](ib, ob, c.group.size or 1))
                    self.unsized.discard(ci)
        return calls

    def _timed(self, calls: list[CollectiveEvent], comm: Activities) -> list[CollectiveEvent]:
        """Each call's latency: from its first activity's start to its last's end. On a CPU trace
        gloo's spans are first tied to calls (see the module docstring)."""
        if self.gloo and calls:
            calls = self._tie_gloo(calls, comm)
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        for start, end, _, ref in comm:
            if ref >= 0:
                first[ref] = min(first.get(ref, start), start)
                last[ref] = max(last.get(ref, end), end)
        return [c._replace(latency_s=(last[i] - first[i]) / 1e6) if i in first else c for i, c in enumerate(calls)]


def _splits(rows: list[int] | None, total: int, n: int) -> tuple[int, ...] | None:
    """Split sizes in rows of dim 0 as bytes per member; even where none were given."""
    if not rows:
        return _ops.even_splits(total, n)
    count = sum(rows)
    if count <= 0 or total % count or len(rows) != n:
        return None
    row = total // count
    return tuple(r * row for r in rows)


def _arg_bytes(dims: list[Any], types: Any, where: int | str | None) -> tuple[int | None, tuple[tuple[int, ...], ...], str | None]:
    """Bytes, shapes and dtype of the op argument at ``where`` from ``Input Dims``/``Input type``
    (a tensor's dims are a list of ints, a tensor list's a list of such lists)."""
    if not isinstance(where, int) or where >= len(dims):
        return None, (), None
    arg = dims[where]
    shapes = [tuple(arg)] if arg and all(isinstance(d, int) for d in arg) else [tuple(s) for s in arg if isinstance(s, list)]
    if arg == []:
        shapes = [()]
    type_name = types[where] if isinstance(types, list) and where < len(types) else None
    dtype, esize = _INPUT_TYPES.get(str(type_name), (None, 0))
    if not esize:
        return None, tuple(shapes), None  # a tensor list's element type is not written
    return sum(math.prod(s) for s in shapes) * esize, tuple(shapes), dtype
