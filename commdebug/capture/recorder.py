"""The recorder: a TorchDispatchMode plus module hooks that decides what each collective was
(op, bytes, group, module, phase, step, source line, whether it finished) and appends it to a
:class:`~commdebug.model.trace.Trace`. It formats nothing and reads no file; the public
:class:`commdebug.CommDebugMode` adds the drop-in query and report methods on top.

The hot path is ``__torch_dispatch__``: it runs for every op of the program, so what it touches
is cached per op (``_FUNC_INFO``) and per code object (:mod:`commdebug.capture.source`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from commdebug import ops as _ops
from commdebug.capture import light as light_capture, loaded
from commdebug.capture.config import Options, read_config
from commdebug.capture.groups import GroupResolver, peer_rank
from commdebug.capture.inflight import FlightViews, InFlight, wait_until_finished, work_patch
from commdebug.capture.metadata import distributed_metadata, now, run_metadata
from commdebug.capture.pipelining import PipelineTags, first_tensor
from commdebug.capture.source import caller, native_view
from commdebug.capture.stepping import Stepping, say_once
from commdebug.capture.timekeeping import Timekeeping, clock_origin, waited_at_once
from commdebug.capture.timing import SyncTimer, nvtx_label, on_cuda
from commdebug.capture.tracker import ModuleTracker
from commdebug.model.trace import BACKWARD, FORWARD, GLOBAL, CollectiveEvent, Trace

__all__ = ["Recorder", "CONTEXT_EXIT"]

_graph_task_id = torch._C._current_graph_task_id
_new_tuple = light_capture.new_event  # tuple.__new__, the event untracked by the collector where built
_HOP = torch._ops.HigherOrderOperator


def _describe(func: Any) -> tuple:
    """(collective spec or None, op name (interned: its hash is computed once), func).

    ``func`` is kept so the id it is cached under stays unique."""
    if isinstance(func, _HOP):
        return _HOP, str(func), func
    packet = func._overloadpacket
    spec = _ops.capture_spec(packet)
    return spec, sys.intern(str(func)), func


_WAIT = _ops.WAIT
# Static facts about each op the mode has seen, shared by all instances and contexts.
_FUNC_INFO: dict[int, tuple] = {}


class _Unset:
    def __repr__(self) -> str:
        return "(default)"


_UNSET: Any = _Unset()  # an option not given: the environment or the default decides
# metadata.ended_by of a recording whose ``with`` block ended without an exception
CONTEXT_EXIT = "context exit"
log = logging.getLogger("commdebug")


class Recorder(Stepping, Timekeeping, FlightViews, TorchDispatchMode):
    """Records every collective issued while it is active into ``self.trace``.

    Use :class:`commdebug.CommDebugMode` (this plus the drop-in API); its docstring lists the
    options. ``in_flight()`` and ``mark_in_flight()`` say which collectives have not finished;
    ``step()`` marks a step boundary.
    """

    def __init__(
        self,
        *,
        max_events: int | None | _Unset = _UNSET,
        record_source: bool | _Unset = _UNSET,
        timing: bool | str | _Unset = _UNSET,
        auto_step: bool | _Unset = _UNSET,
        ops: Iterable[str] | None | _Unset = _UNSET,
        crossnode_only: bool | _Unset = _UNSET,
        ranks_per_node: int | None | _Unset = _UNSET,
        start_step: int | _Unset = _UNSET,
        end_step: int | None | _Unset = _UNSET,
        verbose: bool | _Unset = _UNSET,
        nvtx: bool | _Unset = _UNSET,
        enabled: bool | _Unset = _UNSET,
        cluster: str | os.PathLike | None | _Unset = _UNSET,
        light: bool | _Unset = _UNSET,
        detail_every: int | None | _Unset = _UNSET,
        config: Mapping[str, Any] | str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        given = {k: v for k, v in locals().items() if k not in ("self", "config", "__class__") and v is not _UNSET}
        self.options = Options.resolve(given, read_config(config) if config is not None else None)
        self.supports_higher_order_operators = True
        self._listeners: list[Callable[[CollectiveEvent], None]] = []
        self._check_options()
        self._reset()

    def _check_options(self) -> None:
        """Checks of options that need more than capture knows (the facade checks the cluster)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # skipped all the same, without importing Dynamo first: the end of this file

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Dynamo and Inductor compile with this mode off, and compiled code runs with it on: a
        # compiled program stays compiled, and its collectives come through the mode as it runs
        return True

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike, **overrides: Any) -> Recorder:
        """A mode configured by a dict or a JSON file: our option names, or a DeepSpeed config
        with a ``comms_logger`` block, read as is. ``overrides`` win over the file.

        >>> comm = CommDebugMode.from_config({"timing": "sync", "ops": ["all_reduce"]})
        >>> comm = CommDebugMode.from_config("ds_config.json")   # doctest: +SKIP
        """
        return cls(config=config, **overrides)

    # the reference's attribute names, read-only views of the options
    max_events = property(lambda self: self.options.max_events)
    record_source = property(lambda self: self.options.record_source)
    timing = property(lambda self: self.options.timing != "off")
    auto_step = property(lambda self: self.options.auto_step)

    def _reset(self) -> None:
        self.trace = Trace(self.max_events)
        self._params: dict[str, dict[str, torch.nn.Parameter]] = {}
        self._sharding: dict[str, Any] = {}
        self._tracker = ModuleTracker(self._on_first_call, self._moved, self._on_optimizer_step)
        # where ops dispatched now belong, and the append of that place's pending op list:
        # recomputed by _sync when the tracker moves or autograd starts or ends a backward
        self._task = -2
        self._where: tuple[str, str] = (GLOBAL, FORWARD)
        self._record = self.trace.op_list(GLOBAL, FORWARD).append
        self._groups = GroupResolver()
        self._seq: dict[str, int] = defaultdict(int)
        self._p2p_seq: dict[tuple[str, int | None, str], int] = defaultdict(int)
        self._pipeline = PipelineTags()
        self._last_dtensor: tuple | None = None
        self._events_at_boundary = self._forwards_at_boundary = 0
        self._last_boundary_automatic = False
        self._paused = False
        self._active = False
        self._mode_on = False  # the dispatch mode is on the stack
        self._light_on = False  # light capture's kernels record (commdebug.capture.light)
        self._reset_timing()
        self._flight = InFlight(self._failed, self._waited if self._events is not None else None)
        self._unfinished_at_exit: list[tuple[int, float]] = []
        self._meta_fresh = False
        # no filter, timer or NVTX range, metadata read: _collective's plain path (set by the
        # first collective, which reads the metadata)
        self._plain = False
        self._call_facts: dict[tuple[str, str], tuple] = {}  # (op, group name) -> count key, busbw factor, size rule
        self._record_source = self.options.record_source
        self._compiled_seen = False
        self._t0, self._t0_wall = clock_origin()
        self._recorded_s = 0.0
        self._resumed_at = self._t0

    # ---- context ----------------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self._reset()
        self.trace.metadata = run_metadata()
        self.trace.metadata["start_wall_s"] = self._t0_wall  # start_s's 0, to the us: `trace` puts ranks on one clock
        self.trace.metadata["timing"] = self.options.timing
        light = self.options.light
        self.trace.metadata["capture"] = "light" if light else "full"
        if light:
            self.trace.metadata["detail_every"] = self.options.detail_every
            self.trace.metadata["detail_steps"] = []
        if not self.options.enabled:
            return self
        if not light:
            self._push_mode()
        try:
            work_patch().add(self._flight)
            self._tracker.__enter__()
            self._pipeline.__enter__()
            if self._async is not None:
                self._async.__enter__()
            if light:
                light_capture.attach(self)
        except BaseException:
            self._pipeline.__exit__()
            self._tracker.__exit__()
            work_patch().remove(self._flight)
            self._pop_mode()
            raise
        self._active = True
        self._resumed_at = time.perf_counter()
        if light:
            self._apply_detail()
        if self.options.nvtx and not torch.cuda.is_available():
            say_once("nvtx", "nvtx=True has no effect without CUDA: there is no Nsight timeline to annotate")
        if self.options.start_step > 0:
            self._pause()  # until the window opens
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._active:
            return
        if self._paused:  # the mode is not on the stack: put it back for the pop below
            self._resume()
        try:
            self._recorded_s += time.perf_counter() - self._resumed_at
            self._tracker.__exit__()
            self._pipeline.__exit__()
            self._finish_timing()
            work_patch().remove(self._flight)
            # what was still running when the context ended stays known for the dump; the
            # Work objects (and the buffers they hold) are let go
            self._unfinished_at_exit = self._flight.unfinished()
            self._flight.clear()
            meta = self.trace.metadata
            # how the recording ended, for `check`; `commdebug run` says how the program did
            error = exc[1] if len(exc) > 1 else None
            meta.setdefault("ended_by", CONTEXT_EXIT if error is None else f"{type(error).__name__}: {error}")
            self.stamp_end(self._recorded_s)
        finally:
            self._active = self._light_on = False
            light_capture.detach(self)
            if self._mode_on:
                self._mode_on = False
                super().__exit__(*exc)

    def _on_first_call(self, mod: torch.nn.Module, fqn: str, parent: str) -> None:
        # Parameters are kept as they are: reading ``.data`` of a DTensor dispatches a detach
        # through DTensor, for every parameter on every new context.
        placements: dict[str, str] = {}
        # torch.compile(module) wraps it: its type and parameters are the original's
        mod = getattr(mod, "_orig_mod", mod) if type(mod).__name__ == "OptimizedModule" else mod
        params = self._params.setdefault(fqn, {})
        dtensor = loaded.dtensor()
        for name, param in mod._parameters.items():
            if param is None:
                continue
            params[name] = param
            if dtensor is not None and isinstance(param, dtensor):
                placements[name] = _text(param.placements)
                self._sharding[f"{fqn}.{name}"] = param.placements
        if not params:
            del self._params[fqn]
        self.trace.add_module(fqn, parent, _text(type(mod)), placements)

    # ---- the hot path -----------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None) -> Any:
        # Runs for every op: dict keys here are ints and strings, whose hashes are computed in
        # C; hashing an OpOverload calls a Python __hash__.
        info = _FUNC_INFO.get(id(func))
        if info is None:
            info = _FUNC_INFO[id(func)] = _describe(func)
        spec, name = info[0], info[1]
        if spec is _HOP:
            return func(*args, **(kwargs or {}))

        if _graph_task_id() != self._task:
            self._sync()

        # `types` is empty for plain tensors; a tensor subclass is there for DTensor's ops
        if types and (dtensor := loaded.dtensor()) is not None and dtensor in types:
            # Let DTensor lower the op first; its collectives come back through this mode.
            shapes, placements, mesh = [], [], None
            for a in args:
                if isinstance(a, dtensor):
                    spec_ = a._spec
                    shapes.append(a.shape)
                    placements.append(spec_.placements)
                    mesh = spec_.mesh
            sig = (name, tuple(shapes), tuple(placements), mesh)
            self._record(sig)
            self._last_dtensor = sig
            return NotImplemented

        self._record(name)
        if spec is None:
            return func(*args, **(kwargs or {}))
        if spec is _WAIT:
            return self._wait(func, args, kwargs or {})
        return self._collective(func, name, spec, args, kwargs or {})

    def _light_call(self, call: Callable[..., Any], name: str, spec: Any, args: tuple, kwargs: dict) -> Any:
        """A collective (or a wait) seen by light capture's kernel; ``call`` runs it below the
        kernel. The same bookkeeping as under the dispatch mode, minus the op rows."""
        if spec is _WAIT:
            return self._wait(call, args, kwargs)
        if not self._plain and not self._wanted(spec):  # plain: no filter
            return call(*args, **kwargs)  # filtered out by ``ops``: not even located
        # light steps keep no op rows, and the tracker reports no moves: locate every collective
        self._where = self._tracker.location()
        return self._collective(call, name, spec, args, kwargs)

    def _native_state(self) -> tuple:
        """What light capture's C++ kernel reads to record a call itself while this recording is
        plain (``_light_on`` and ``_plain``, which it checks at every call): set when the
        recording attaches (after ``_reset``), so every object here lives as long as the
        recording. The kernel builds the event ``_record_collective`` builds, from the facts
        this path worked out on the op's first call on its group (``_call_facts``, the
        resolved group), and calls the functions below for the rest (commdebug/capture/_native.cpp)."""
        trace, flight = self.trace, self._flight
        return (self, self._tracker, self._tracker.where, self._groups._by_name, self._seq, self._call_facts, trace,
                trace.add_collective, trace.add_event, flight.issued, flight.tensor_issued, flight.work_issued, flight.done, flight.failed, caller,
                CollectiveEvent, _ops._DTYPE_NAMES, light_capture._STATE, self._t0, bool(self._record_source), native_view(),
                (GLOBAL, (GLOBAL,), BACKWARD))

    def _moved(self) -> None:
        # tracker callback, several per module call: only note it; the next op syncs
        self._task = -2

    def _sync(self) -> None:
        """Point ``_record`` at the op list of where the program is now."""
        self._task = _graph_task_id()
        where = self._tracker.location()
        if where != self._where:
            self._where = where
            ops = self.trace.op_list(*where)
            if len(ops) > 4096:  # bound what waits to be counted
                self.trace.count_ops(where)
            self._record = ops.append

    # ---- collectives ------------------------------------------------------------------------

    def _collective(self, func: Callable[..., Any], name: str, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict) -> Any:
        if not self._plain or spec.is_p2p:
            return self._collective_with_options(func, name, spec, args, kwargs)
        # the common case, which light capture pays for every collective: no filter, no timer
        group = self._groups.resolve(spec.group, args)
        fqn, phase = self._where  # synced by __torch_dispatch__ just before
        start_s = time.perf_counter() - self._t0  # when it was called
        # in the record before it runs where nothing recorded comes from its result (eager c10d
        # ops): a process that dies inside the call (gloo's native abort) keeps it
        early = self._record_collective(name, spec, args, kwargs, None, group, None, fqn, phase, start_s) if spec.known_before else None
        try:
            out = func(*args, **kwargs)
        except Exception as e:  # recorded all the same, as failed
            self._flight.failed((early or self._record_collective(name, spec, args, kwargs, None, group, None, fqn, phase, start_s)).index, e)
            raise
        # recorded before any wait: a collective that then hangs or raises is in the dump
        if early is None:
            event = self._record_collective(name, spec, args, kwargs, out, group, None, fqn, phase, start_s)
        else:
            event = early
            self._in_flight(event, spec, args, kwargs, out)
        if self._listeners:
            self._emit(event)
        return out

    def _collective_with_options(self, func: Callable[..., Any], name: str, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict) -> Any:
        """:meth:`_collective` with what the plain path leaves out: the first call (metadata),
        the ``ops`` and ``crossnode_only`` filters, timing, NVTX ranges, point-to-point peers."""
        options = self.options
        if not self._meta_fresh:  # the process group may have been set up after entering
            self._meta_fresh = True
            self.refresh_metadata()
            self._plain = options.plain and self._async is None
        if not self._wanted(spec):
            return func(*args, **kwargs)  # not asked for: run it, record nothing
        group = self._groups.resolve(spec.group, args)
        peer = peer_rank(spec, args, group) if spec.is_p2p else None
        if options.crossnode_only and not self._groups.crosses_nodes(group, peer, int(self.trace.metadata.get("rank") or 0), options.ranks_per_node or 1):
            return func(*args, **kwargs)
        fqn, phase = self._where
        timer = stamp = None
        cuda = (options.timing != "off" or options.nvtx) and on_cuda(args)
        timing = self._timing_for(cuda, waited_at_once(spec, args, kwargs))
        if timing == "sync":
            if spec.is_p2p:
                # Waiting on a send before its matching receive is posted deadlocks rings
                # and pipeline schedules, and gloo's sends have no future to time them by.
                self._note("p2p", "timing='sync' does not time send/recv: waiting on each would change the program's order and can deadlock it")
            else:
                timer = SyncTimer(cuda, early=cuda and self._groups.waits_on_stream(group.name))
        nvtx = options.nvtx and cuda
        if nvtx:
            torch.cuda.nvtx.range_push(nvtx_label(spec.op, _ops.tensor_bytes(_ops.pick(spec.inputs, args, kwargs, None))[0], group, fqn))
        try:
            start_s = time.perf_counter() - self._t0
            # in the record before it runs where it can be (see _collective), before the clock starts
            early = self._record_collective(name, spec, args, kwargs, None, group, peer, fqn, phase, start_s) if spec.known_before else None
            if timer is not None:
                timer.start()
            elif timing == "events":
                stamp = self._events.start(cuda) if self._events is not None else None
            try:
                out = func(*args, **kwargs)
            except Exception as e:
                event = early or self._record_collective(name, spec, args, kwargs, None, group, peer, fqn, phase, start_s)
                self._flight.failed(event.index, e)
                raise
            if early is not None:
                self._in_flight(early, spec, args, kwargs, out)
            if timer is not None:
                try:  # where the wait returns at once (NCCL), the clock stops before our own work (timing.py)
                    timer.stop_early(lambda: wait_until_finished(out, spec, args, kwargs))
                except Exception as e:
                    self._flight.failed((early or self._record_collective(name, spec, args, kwargs, out, group, peer, fqn, phase, start_s)).index, e)
                    raise
            event = early or self._record_collective(name, spec, args, kwargs, out, group, peer, fqn, phase, start_s)
            if timer is not None:
                try:
                    timer.wait(lambda: wait_until_finished(out, spec, args, kwargs))
                except Exception as e:
                    self._flight.failed(event.index, e)
                    raise
                self._flight.finished(event.index)  # the mode's own wait goes around the wrapped ones
                # on CPU the span is the timer's own, from its start (after the early record) to the wait's return
                start = start_s if cuda else timer.host_start - self._t0
                event = self.trace.update_event(event.index, latency_s=timer.seconds, start_s=start) or event
            elif stamp is not None:  # never waited for here: the end is read when it is done
                seconds = self._events_issued(event.index, stamp, cuda, out, spec, group)
                if seconds is not None:
                    event = self.trace.update_event(event.index, latency_s=seconds) or event
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()
        if self._async is not None and self._async.watch(group.name, self._groups.pg(group.name)):
            self._async.issued(group.name, self._groups.pg(group.name), event.index)  # timed later
        elif self._listeners:
            self._emit(event)
        return out

    def _wanted(self, spec: _ops.CollectiveSpec) -> bool:
        """Whether the ``ops`` filter lets this collective be recorded."""
        ops = self.options.ops
        return ops is None or spec.op in ops

    def _record_collective(self, name: str, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict, out: Any, group: Any,
                peer: int | None, fqn: str, phase: str, start_s: float) -> CollectiveEvent:
        """Count one collective and keep its event; ``out`` is None when the call raised.

        Runs for every collective: what depends only on the op and its group comes from
        ``_call_facts``, worked out on the op's first call on the group."""
        trace = self.trace
        facts = self._call_facts.get((name, group.name))
        if facts is None:  # the op's first call on this group
            facts = self._call_facts[(name, group.name)] = (
                (spec.compat_key, spec.op, group.name), spec.busbw_factor(group.size), _ops.MESSAGE_SIZE[spec.size])
            trace.add_group(group)
        count_key, busbw_factor, size_rule = facts
        # _ops.pick, its common case (an argument) written out: this runs for every collective
        at = spec.inputs
        inputs = args[at] if type(at) is int and at < len(args) else _ops.pick(at, args, kwargs, out)
        at = spec.outputs
        outputs = args[at] if type(at) is int and at < len(args) else _ops.pick(at, args, kwargs, out)
        in_bytes, in_shapes, dtype = _ops.tensor_bytes(inputs)
        # in place (all_reduce_, broadcast_): the same tensor, read once
        out_bytes, out_shapes, out_dtype = (in_bytes, in_shapes, dtype) if outputs is inputs else _ops.tensor_bytes(outputs)
        dtype = dtype or out_dtype
        size = size_rule(in_bytes, out_bytes, group.size)
        send_splits, recv_splits = (None, None) if spec.splits is None else _ops.split_bytes(  # all_to_all: bytes per member
            spec, args, inputs, outputs, in_bytes, out_bytes, group.size)

        seq = p2p_seq = microbatch = None
        path = None
        if spec.is_p2p:
            key = (group.name, peer, spec.op)
            p2p_seq = self._p2p_seq[key]
            self._p2p_seq[key] = p2p_seq + 1
            tag = self._pipeline.pop(first_tensor(inputs if inputs is not None else outputs))
            if tag is not None:
                # a pipelining schedule's send/recv: its phase and stage, not "outside any module"
                phase, microbatch = tag.phase, tag.microbatch
                if tag.module is not None:
                    path = self._tracker.path_of(tag.module)
                    fqn = path[-1]
        else:
            seqs = self._seq
            seq = seqs[group.name]
            seqs[group.name] = seq + 1
        tracker = self._tracker
        if path is None:
            path = tracker.path(phase)
            if phase == BACKWARD:  # the autograd node running may name an ancestor of the markers' module
                fqn = path[-1]
        trace.add_collective(path, phase, count_key, size)

        source, from_dtensor, compiled = caller(2)
        dt = self._last_dtensor if from_dtensor else None
        index = trace.events_total
        # positional, in CollectiveEvent's field order, without the namedtuple's Python-level
        # __new__: this runs for every collective
        event = _new_tuple(CollectiveEvent, (
            index, spec.op, spec.compat_key, name, trace.step, phase, fqn, group, seq,
            dtype, in_shapes, out_shapes, in_bytes, out_bytes, size, busbw_factor,
            None if dt is None else dt[0],  # dtensor_op, placements, mesh
            None if dt is None else _text(dt[2], list),
            None if dt is None or dt[3] is None else _text(dt[3]),
            source if self._record_source else None,
            None, peer, p2p_seq, microbatch, start_s, False, None, tracker.unit, compiled, send_splits, recv_splits,
        ))
        trace.add_event(event)
        if self.issue_listeners:
            for listener in self.issue_listeners:
                listener(event)
        if compiled and not self._compiled_seen:
            self._compiled_seen = True
            self._compiled_note(fqn)
        if out is not None and not spec.returns_done:
            self._flight.issued(index, group.name, seq, out, outputs)
        return event

    def _in_flight(self, event: CollectiveEvent, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict, out: Any) -> None:
        """What ``_record_collective`` does with the call's result, for an event recorded before
        the call ran: its Work (or output) joins the collectives in flight."""
        if out is not None and not spec.returns_done:
            self._flight.issued(event.index, event.group.name, event.seq, out, _ops.pick(spec.outputs, args, kwargs, out))

    # ---- in flight (hang detection) ----------------------------------------------------------

    def _wait(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            if args:
                self._flight.tensor_waited(args[0], e)
            raise
        if args:
            self._flight.tensor_waited(args[0])
        return out

    def _failed(self, index: int, error: str) -> None:
        # InFlight's callback; may run on any thread that waited
        self.trace.update_event(index, error=error)

    def _compiled_note(self, fqn: str) -> None:
        """Said once, on the first collective of compiled code: what attribution it gets."""
        message = ("torch.compile: collectives issued by compiled code are marked (compiled); each belongs to the "
                   "compiled module it ran in, not to that module's submodules (compile per block to see each block)")
        if fqn == GLOBAL:
            message += "; a compiled top-level module (model.compile()) is not seen: its collectives are under Global"
        self.trace.metadata.setdefault("compile_notes", []).append(message)
        log.warning("commdebug: %s", message)

    def _emit(self, event: CollectiveEvent) -> None:
        for listener in self._listeners:
            listener(event)

    def stamp_end(self, recorded_s: float | None = None) -> None:
        """Write the recording's end into the metadata: end time, elapsed and recorded seconds, steps
        and the step it ended in. At the context's exit; also by a session that writes its final dump
        from another thread while the mode is still entered (a SIGTERM handled off the main thread), so that every final dump has them."""
        meta = self.trace.metadata
        meta["end_time"] = now()
        meta["elapsed_s"] = time.perf_counter() - self._t0
        meta["recorded_s"] = self.recorded_so_far() if recorded_s is None else recorded_s
        meta["steps"], meta["step"] = self.trace.steps, self.trace.step  # a count; the step it ended in

    @property
    def recording(self) -> bool:
        """True between entering the context and leaving it (paused windows included)."""
        return self._active

    def recorded_so_far(self) -> float:
        """Seconds spent recording (outside paused windows), up to now."""
        running = self._active and not self._paused
        return self._recorded_s + (time.perf_counter() - self._resumed_at if running else 0.0)

    def refresh(self) -> Trace:
        """Bring ``self.trace`` up to date before it is read or dumped mid-run: rank metadata,
        NCCL timings reported since, and the step count. Returns the trace."""
        self.refresh_metadata()
        self._join_timing()
        self.trace.metadata.update(steps=self.trace.steps, step=self.trace.step)
        return self.trace

    def refresh_metadata(self) -> None:
        """Rank, world size and backend from torch.distributed, if it was initialised after the
        context was entered (a recording started before the program set up its process group)."""
        self.trace.metadata.update(distributed_metadata(self.trace.metadata))


_TEXT: dict[Any, str] = {}


def _text(value: Any, as_type: type | None = None) -> str:
    """Module types, placements and meshes as the reference writes them, each formatted once
    (a DeviceMesh's repr alone costs more than the rest of a collective's bookkeeping)."""
    key = (value, as_type)
    text = _TEXT.get(key)
    if text is None:
        text = str(value if as_type is None else as_type(value))
        if isinstance(value, type):
            text = text.replace("<", "").replace(">", "")  # "class 'torch.nn.Linear'"
        _TEXT[key] = text
    return text


Recorder.__torch_dispatch__ = loaded.skip_dynamo_lazily(Recorder.__dict__["__torch_dispatch__"])  # type: ignore[method-assign]
