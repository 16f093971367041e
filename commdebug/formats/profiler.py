"""torch.profiler (Kineto) Chrome traces as commdebug data: one rank's :class:`Profile` (when
communication and compute ran) and its collectives as events, so ``check``, ``report``,
``overlap`` and the rest read a profiler trace as they read a dump.

What a trace says about a collective depends on its backend and vintage. Every record of a
call counts it once, under its op, whichever of them the trace has (:mod:`.profile_calls`):

- ``record_param_comms`` (torch 2.1+ on NCCL): dtype, element counts, all_to_all split sizes,
  group (name, description, ranks, size), ``"Seq"`` (torch counts from 1; shifted to ours, from
  0), p2p peer; its GPU kernel (the one sharing an ``External id`` of the call's records, else the
  one whose CUDA launch lies inside the call) gives the latency, NCCL's own time; older torch
  writes it without arguments;
- ``nccl:<op>`` annotations: the op where no dispatcher op names it (NCCL's all_to_all);
- ``c10d::*`` (and functional collective) ops: the op as the program called it, and sizes from
  the op's inputs (by the op registry's argument positions) where shapes were recorded. On gloo,
  the only record: the work is a ``gloo:<op>`` span on a gloo thread, matched to the earliest
  call of the same op (and shape) issued before it, which gives the latency.

A group the trace does not name is left unknown, never guessed, but where ``distributedInfo``
lists one group only; without ``"Seq"`` a known group's calls are numbered in their order in the
trace. A size no record gives is None (``?`` in text, null in JSON), never 0. A call's step is
the ``ProfilerStep#N`` it lies in; its phase is ``optimizer`` inside ``Optimizer.step#*``,
``backward`` inside an autograd engine function or one of FSDP's backward hooks (its last
reduce_scatter runs in ``FSDP::root_post_backward_callback``, outside the engine), else
``forward`` (as commdebug's own capture counts). What is left unknown is said once, in a note
that names the fact it rests on.

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
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import DumpError
from commdebug.formats.kineto import KinetoEvents, read_events
from commdebug.formats.profile_calls import NOT_CALLS, CallReader, arg_bytes, collective_op, group_calls
from commdebug.formats.trace_spans import (
    KINDS,
    CallsAt,
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
_STEP = re.compile(r"^ProfilerStep#(\d+)")
# spans whose calls are backward: the autograd engine's functions, and FSDP's backward hooks,
# which run outside them (FSDP2's last reduce_scatter, in root_post_backward_callback)
_BACKWARD_SPANS = ("autograd::engine::evaluate_function", "FSDP::root_post_backward", "FSDP::post_backward", "FSDP::pre_backward",
                   "FSDP::backward_prefetch")
# the spans gloo runs a call as, where they are another op's (ProcessGroupGloo's reduce_scatter
# of one tensor is an all_reduce, its result copied out)
_GLOO_RUNS_AS = {"reduce_scatter": ("all_reduce",)}
# ops whose input and output are the same tensors: a gloo span's input dims give both
_SAME_SIZE = frozenset({"all_reduce", "broadcast", "reduce", "send", "recv"})
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


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
        self.unsized: dict[int, str] = {}  # calls whose sizes the trace does not give -> why
        self.bare_rpc = 0  # record_param_comms without arguments
        self.annotations = 0  # nccl:<op> annotations on the CPU
        self.gloo_spans = bool(events.thread_names) and any("gloo" in n.lower() for n in events.thread_names.values())
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
            why = Counter(self.unsized.values())
            self.notes.append(f"{n} collective{'s' if n != 1 else ''} of unknown size, shown as ? and left out of bytes and bandwidths: "
                              + "; ".join(f"{k} {reason}" for reason, k in why.most_common()))
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
        """The trace's CPU events by what they are: ``call`` ((kind, event) of every record of a
        collective call: ``rpc``, ``bare``, ``annotation``, ``op``; :mod:`.profile_calls`),
        ``op`` (collective dispatcher ops), ``gloo`` (gloo's work spans), ``optimizer`` and
        ``backward`` spans (the autograd engine's, and FSDP's backward hooks, which run outside
        it), ``cpu`` (the other CPU ops)."""
        out: dict[str, list[Any]] = defaultdict(list)
        for e in self.ev.cpu:
            name = str(e.get("name", ""))
            if e.get("dur") is None or e.get("ts") is None:
                continue
            if name == "record_param_comms":
                args = e.get("args") or {}
                collective = str(args.get("Collective name") or "")
                if not collective:
                    out["call"].append(("bare", e))
                    self.bare_rpc += 1
                elif collective not in NOT_CALLS:
                    out["call"].append(("rpc", e))
            elif name.startswith("nccl:") and e.get("cat") not in ("kernel", "gpu_user_annotation"):  # the CPU's
                out["call"].append(("annotation", e))
                self.annotations += 1
            elif name.startswith("gloo:"):
                out["gloo"].append(e)
            elif name.startswith("Optimizer.step#"):
                out["optimizer"].append(e)
            elif name.startswith(_BACKWARD_SPANS):
                out["backward"].append(e)
            elif _dispatcher_spec(name) is not None:
                out["op"].append(e)
                out["call"].append(("op", e))
            elif e.get("cat") == "cpu_op":
                out["cpu"].append(e)
        return out

    def _calls(self, records: dict[str, list[Any]],
               steps: list[ProfileStep]) -> tuple[list[CollectiveEvent], list[tuple[Any, float, float, int]]]:
        """The calls, in issue order, and each call's CPU span on its thread (tid, start, end, index)."""
        grouped, lone = group_calls(records["call"])
        reader = CallReader(self.groups, _dispatcher_spec)
        optimizer = ThreadSpans((e.get("tid"), *span(e)) for e in records["optimizer"])
        backward = ThreadSpans((e.get("tid"), *span(e)) for e in records["backward"])
        calls: list[CollectiveEvent] = []
        spans: list[tuple[Any, float, float, int]] = []
        seq_of: dict[str, int] = defaultdict(int)
        p2p_of: dict[tuple[str, str, int | None], int] = defaultdict(int)
        no_group = 0
        with_rpc = 0
        step_starts = [s.start for s in steps]
        for c in grouped:
            start, tid = c.start, c.tid
            self.fractional = self.fractional or start != int(start)
            f = reader.read(c)
            with_rpc += c.rpc is not None
            op, group, seq = f.op, f.group, f.seq
            if group is UNKNOWN_GROUP:
                no_group += 1
            if f.unsized is not None:
                self.unsized[len(calls)] = f.unsized
            spec = _ops.spec_for_op(op)
            n = group.size
            size, factor = _message(spec, f.input_bytes, f.output_bytes, n)
            p2p_seq = None
            if op in ("send", "recv"):
                key = (group.name, op, f.peer)
                p2p_seq = p2p_of[key]
                p2p_of[key] += 1
                seq = None
            elif group is UNKNOWN_GROUP:
                seq = None
            elif seq is None:
                seq = seq_of[group.name]
                seq_of[group.name] += 1
            step = steps[max(bisect_right(step_starts, start) - 1, 0)].number if steps else 0
            phase = OPTIMIZER if optimizer.covers(tid, start) else BACKWARD if backward.covers(tid, start) else FORWARD
            spans.append((tid, start, c.end, len(calls)))
            for ext in c.externals:  # the ops NCCL's kernels are launched from
                self.call_external.setdefault(ext, len(calls))
            named = c.op if c.op is not None else c.rpc if c.rpc is not None else c.annotation
            calls.append(CollectiveEvent(
                index=len(calls), op=op, key=f"profiler:{op}", aten_op=str((named or {}).get("name")), step=step, phase=phase,
                module="?", group=group, seq=seq, dtype=f.dtype, input_shapes=f.input_shapes, output_shapes=f.output_shapes,
                input_bytes=f.input_bytes, output_bytes=f.output_bytes, size_bytes=size, busbw_factor=factor,
                peer=f.peer, p2p_seq=p2p_seq, start_s=start, send_splits=f.send_splits, recv_splits=f.recv_splits))
        self.notes.extend(self._record_notes(len(calls), with_rpc, lone, no_group, reader))
        if seq_of:
            self.notes.append("the trace records no sequence numbers: each group's calls are numbered in their order in the "
                              "trace (the ranks' traces must cover the same steps to be compared)")
        return calls, spans

    def _record_notes(self, calls: int, with_rpc: int, lone: int, no_group: int, reader: CallReader) -> list[str]:
        """What the trace's records leave unknown, each said with the fact it rests on."""
        notes = []
        if calls and not with_rpc:
            if self.bare_rpc:
                outside = (f"; {lone} of them lie outside any collective's annotation or op (a wait leaves the same record) "
                           "and are not counted" if lone else "")
                notes.append(f"the trace's {self.bare_rpc} record_param_comms carry no arguments (as older torch wrote them): "
                             "ops from the nccl:<op> annotations and c10d ops, sizes from the c10d ops where shapes were recorded, "
                             f"no process groups unless distributedInfo lists one{outside}")
            elif self.annotations:
                notes.append("the trace has no record_param_comms: ops from the nccl:<op> annotations and c10d ops, sizes from the "
                             "c10d ops where shapes were recorded, no process groups unless distributedInfo lists one")
        if no_group:
            notes.append(f"{no_group} collective{'s' if no_group != 1 else ''} name no process group ({self._why_no_group(with_rpc)}): "
                         "check cannot pair them across ranks; record with `commdebug run --profile-steps` to join them to the dump")
        if reader.spellings:
            named = ", ".join(f"{name} ({n})" for name, n in reader.spellings.most_common())
            total = sum(reader.spellings.values())
            notes.append(f"{total} collective{'s' if total != 1 else ''} under a name no op of commdebug's registry has, counted "
                         f"under that name: {named}")
        return notes

    def _why_no_group(self, with_rpc: int) -> str:
        """Why a trace's calls name no group, from what the trace holds."""
        groups = len(self.groups)
        listed = (f"; distributedInfo lists {groups} groups, so none can be assumed" if groups > 1
                  else "; distributedInfo lists none" if not groups else "")
        backend = str(self.info.get("backend") or "")
        if with_rpc:
            return "their record_param_comms carry no group name" + listed
        if self.bare_rpc:
            return "the trace's record_param_comms carry no arguments" + listed
        if backend == "gloo" or self.gloo_spans:
            return "a gloo trace writes no record_param_comms, which would name it" + listed
        return "the trace has no record_param_comms, which would name it" + listed

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
            op = collective_op(str(e.get("name", "")).split(":", 1)[1].split(" ", 1)[0])
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
                nbytes, _, dtype = arg_bytes(dims, args.get("Input type"), 0)
                spec = _ops.spec_for_op(op)
                if nbytes is not None and spec is not None:
                    c = calls[ci]
                    ib = nbytes if spec.inputs is not None else 0
                    ob = nbytes if spec.outputs is not None else 0
                    size, factor = _message(spec, ib, ob, c.group.size)
                    calls[ci] = c._replace(input_bytes=ib, output_bytes=ob, dtype=dtype, size_bytes=size, busbw_factor=factor)
                    self.unsized.pop(ci, None)
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


def _message(spec: _ops.CollectiveSpec | None, in_bytes: int | None, out_bytes: int | None,
             n: int) -> tuple[int | None, float | None]:
    """A call's message size S and busbw factor; None where what they depend on is not known
    (its sizes, or its group's size for an op whose S or factor depends on it)."""
    if spec is None:  # an op the registry does not know: its input bytes, no bus factor
        return in_bytes, None
    factor = spec.busbw_factor(n) if n > 0 or spec.factor in ("one", "zero") else None
    if spec.size == "zero":
        return 0, factor
    if in_bytes is None or out_bytes is None or (n <= 0 and spec.size in ("in_x_n", "out_x_n")):
        return None, factor
    return _ops.MESSAGE_SIZE[spec.size](in_bytes, out_bytes, n), factor
