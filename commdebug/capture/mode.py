"""CommDebugMode: the capture side. Decides what happened; formats nothing."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from commdebug import ops as _ops
from commdebug.capture.config import Options, read_config
from commdebug.capture.groups import GroupResolver
from commdebug.capture.pipelining import PipelineTags
from commdebug.capture.inflight import InFlight, tensors, work_patch
from commdebug.capture.metadata import distributed_metadata, now, run_metadata
from commdebug.capture.timing import AsyncTimer, SyncTimer, nvtx_label
from commdebug.capture.tracker import BACKWARD, CHECKPOINT, FORWARD, ModuleTracker
from commdebug.model.trace import GLOBAL, PHASES, CollectiveEvent, Trace

__all__ = ["CommDebugMode"]

_graph_task_id = torch._C._current_graph_task_id
_HOP = torch._ops.HigherOrderOperator
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# DTensor lowers an op to collectives inside this file; a collective with it on the stack came
# from the DTensor op seen last.
_DTENSOR_DISPATCH = os.path.join(_TORCH_DIR, "distributed", "tensor", "_dispatch.py")
# Frames that are never the user's code (commdebug/sourcefiles.py)
from commdebug.sourcefiles import NOT_USER_DIRS as _NOT_USER_DIRS, NOT_USER_MODULES as _NOT_USER_MODULES  # noqa: E402

def _describe(func: Any) -> tuple:
    """(collective spec or None, op name (interned: its hash is computed once), func).

    ``func`` is kept so the id it is cached under stays unique."""
    if isinstance(func, _HOP):
        return _HOP, str(func), func
    packet = func._overloadpacket
    spec = _WAIT if str(packet) in _WAIT_OPS else _ops.lookup(packet)
    return spec, sys.intern(str(func)), func


# A functional collective finishes when its output is waited for: tracked for hang detection.
_WAIT = "wait"
_WAIT_OPS = frozenset({"_c10d_functional.wait_tensor", "c10d_functional.wait_tensor"})


# Static facts about each op the mode has seen, shared by all instances and contexts.
_FUNC_INFO: dict[int, tuple] = {}
# code object -> what its frames are: the user's code, DTensor's dispatch, or other (library)
_USER, _DTENSOR, _LIBRARY = "user", "dtensor", "library"
_FRAME_KIND: dict[Any, str] = {}


def _frame_kind(frame: Any) -> str:
    filename = frame.f_code.co_filename
    if filename == _DTENSOR_DISPATCH:
        return _DTENSOR
    if filename.startswith(_NOT_USER_DIRS) or filename.startswith("<frozen") or frame.f_globals.get("__name__") in _NOT_USER_MODULES:
        return _LIBRARY
    return _USER


class _Unset:
    def __repr__(self) -> str:
        return "(default)"


_UNSET: Any = _Unset()  # an option not given: the environment or the default decides
# metadata.ended_by of a recording whose ``with`` block ended without an exception
CONTEXT_EXIT = "context exit"
log = logging.getLogger("commdebug")
_SAID: set[str] = set()


def _say_once(key: str, message: str) -> None:
    if key not in _SAID:
        _SAID.add(key)
        log.warning("commdebug: %s", message)


_BUSBW: dict[tuple[str, int], float] = {}


def _busbw_factor(spec: _ops.CollectiveSpec, group_size: int) -> float:
    factor = _BUSBW.get((spec.factor, group_size))
    if factor is None:
        factor = _BUSBW[(spec.factor, group_size)] = spec.busbw_factor(group_size)
    return factor


class CommDebugMode(TorchDispatchMode):
    """Record every collective a PyTorch program issues, by module, phase and step.

    A drop-in for ``torch.distributed.tensor.debug.CommDebugMode``: same methods, defaults and
    count keys, and it also works across many training steps, sees eager c10d ops
    (send/recv/barrier too), and records bytes, groups, sources and optional latency.

    Example::

        from commdebug import CommDebugMode

        comm = CommDebugMode()
        with comm:
            for step in range(3):
                model(inp).sum().backward()
                optimizer.step()          # marks a step boundary
        print(comm.generate_comm_debug_tracing_table(noise_level=0))
        comm.generate_json_dump("comm.json", noise_level=2)
        comm.get_comm_counts()[torch.ops.c10d_functional.all_reduce]

    Options (keyword-only; also from ``COMMDEBUG_*`` environment variables and config files,
    see :meth:`from_config` and docs/configuration.md):
        max_events: keep at most this many collective events (the oldest are dropped and
            counted); ``None`` keeps all. Aggregated counts and bytes are never dropped.
        record_source: record the user's ``file:line`` of each collective (turn off to keep
            file paths out of dumps you share).
        timing: ``False``/``"off"``; ``True``/``"sync"``: wait for each collective and record its
            latency (CUDA events on CUDA), which serialises communication with compute, so it
            measures collectives, not whole steps; ``"async"``: NCCL's own kernel timings,
            without waiting (other backends record none and say so once).
        auto_step: let ``optimizer.step()`` mark step boundaries; ``step()`` marks them by
            hand (both together count one boundary).
        ops: record only these collectives (``["all_reduce", "all_gather"]``; torch's and
            deepspeed.comm's names such as ``all_gather_into_tensor`` are understood).
        crossnode_only: record only collectives whose group spans more than one node, with
            ``ranks_per_node`` ranks per node (default: the launcher's ``LOCAL_WORLD_SIZE``).
        start_step, end_step: record only steps ``start_step <= step < end_step``; outside
            that window the mode is popped and the program runs at close to bare speed.
        verbose: log one line per collective to the ``commdebug`` logger (INFO).
        nvtx: on CUDA, wrap each collective in an NVTX range named with op, size, group and
            module, for Nsight.
        enabled: ``False`` makes the context do nothing (DeepSpeed's ``comms_logger.enabled``).
        cluster: a preset (``"h100-ib400"``) or cluster JSON file: summaries add each row's
            predicted time on it, the table each collective line's (noise levels 1-3), and the
            dump keeps it (``metadata.cluster``) so the reports of the file (summary, table,
            Chrome trace, viewer) predict too; computed when a report is made, never while
            recording (docs/estimate.md).
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
        config: Mapping[str, Any] | str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        given = {k: v for k, v in locals().items() if k not in ("self", "config", "__class__") and v is not _UNSET}
        self.options = Options.resolve(given, read_config(config) if config is not None else None)
        self.supports_higher_order_operators = True
        self._listeners: list[Callable[[CollectiveEvent], None]] = []
        self._reset()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike, **overrides: Any) -> "CommDebugMode":
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
        self._async = AsyncTimer(self._note) if self.options.timing == "async" else None
        self._crosses: dict[str, bool] = {}
        self._flight = InFlight(self._failed)
        self._unfinished_at_exit: list[tuple[int, float]] = []
        self._meta_fresh = False
        self._t0 = time.perf_counter()
        self._t0_wall = time.time()
        self._recorded_s = 0.0
        self._resumed_at = self._t0

    # ---- context ----------------------------------------------------------------------------

    def __enter__(self) -> "CommDebugMode":
        self._reset()
        self.trace.metadata = run_metadata()
        self.trace.metadata["timing"] = self.options.timing
        if self.options.cluster is not None:
            from commdebug.estimate import load_cluster

            self.trace.metadata["cluster"] = load_cluster(self.options.cluster).to_dict()
        if not self.options.enabled:
            return self
        if self.options.verbose:
            from commdebug.render.verbose import VerboseLog

            self._listeners = [VerboseLog(int(self.trace.metadata["rank"]))]
        super().__enter__()
        try:
            work_patch().add(self._flight)
            self._tracker.__enter__()
            self._pipeline.__enter__()
            if self._async is not None:
                self._async.__enter__()
        except BaseException:
            self._pipeline.__exit__()
            self._tracker.__exit__()
            work_patch().remove(self._flight)
            super().__exit__(None, None, None)
            raise
        self._active = True
        self._resumed_at = time.perf_counter()
        if self.options.nvtx and not torch.cuda.is_available():
            _say_once("nvtx", "nvtx=True has no effect without CUDA: there is no Nsight timeline to annotate")
        if self.options.start_step > 0:
            self._pause()  # until the window opens
        return self

    def __exit__(self, *exc: Any) -> None:  # type: ignore[override]
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
            meta["end_time"] = now()
            meta["elapsed_s"] = time.perf_counter() - self._t0
            meta["recorded_s"] = self._recorded_s
            meta["steps"] = self.trace.steps
        finally:
            self._active = False
            super().__exit__(*exc)

    def _pause(self) -> None:
        """Stop recording without leaving the context: the dispatch mode is popped and the
        global hooks removed, so the program runs at close to bare speed; state is kept."""
        if self._paused or not self._active:
            return
        self._recorded_s += time.perf_counter() - self._resumed_at
        self._tracker.pause()
        self._pipeline.__exit__()
        super().__exit__(None, None, None)
        self._paused = True

    def _resume(self) -> None:
        """Record again after :meth:`_pause`."""
        if not self._paused:
            return
        super().__enter__()
        self._pipeline.__enter__()
        self._tracker.resume()
        self._paused = False
        self._resumed_at = time.perf_counter()

    def step(self) -> int:
        """Mark a step boundary; returns the current step index.

        Every call counts, except right after ``optimizer.step()`` marked one (when
        ``auto_step``) with no forward pass and no collective in between: calling both counts
        one step. With ``start_step``/``end_step``, recording starts and stops here (also
        while paused, when nothing is recorded between two calls).
        """
        return self._boundary(automatic=False)

    def _boundary(self, automatic: bool) -> int:
        tracker = self._tracker
        work = self.trace.events_total > self._events_at_boundary or tracker.forwards > self._forwards_at_boundary
        # an automatic boundary needs work since the last one; an explicit one only needs not
        # to repeat the automatic boundary just marked
        if work or not (automatic or self._last_boundary_automatic):
            self._events_at_boundary = self.trace.events_total
            self._forwards_at_boundary = tracker.forwards
            self._last_boundary_automatic = automatic
            self.trace.step += 1
            self._join_timing()
            if self.options.windowed:
                self._enter_window(self.trace.step)
        return self.trace.step

    def _enter_window(self, step: int) -> None:
        end = self.options.end_step
        inside = step >= self.options.start_step and (end is None or step < end)
        if inside:
            self._resume()
        elif _get_current_dispatch_mode() is self or self._paused:
            self._pause()
        else:  # another mode was pushed after ours: we cannot pop from under it
            _say_once("window", "a dispatch mode entered after CommDebugMode is active: the step window cannot pause recording")

    def _on_optimizer_step(self) -> None:
        if self.auto_step:
            self._boundary(automatic=True)

    def _on_first_call(self, mod: torch.nn.Module, fqn: str, parent: str) -> None:
        # Parameters are kept as they are: reading ``.data`` of a DTensor dispatches a detach
        # through DTensor, for every parameter on every new context.
        placements: dict[str, str] = {}
        params = self._params.setdefault(fqn, {})
        for name, param in mod._parameters.items():
            if param is None:
                continue
            params[name] = param
            if isinstance(param, DTensor):
                placements[name] = _text(param.placements)
                self._sharding[f"{fqn}.{name}"] = param.placements
        if not params:
            del self._params[fqn]
        self.trace.add_module(fqn, parent, _text(type(mod)), placements)

    # ---- the hot path -----------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
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

        if DTensor in types:
            # Let DTensor lower the op first; its collectives come back through this mode.
            shapes, placements, mesh = [], [], None
            for a in args:
                if isinstance(a, DTensor):
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

    def _collective(self, func, name: str, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict):
        options = self.options
        if not self._meta_fresh:  # the process group may have been set up after entering
            self._meta_fresh = True
            self.refresh_metadata()
        if options.ops is not None and spec.op not in options.ops:
            return func(*args, **kwargs)  # not asked for: run it, record nothing
        group = self._groups.resolve(spec.group, args)
        peer = self._peer(spec, args, group) if spec.is_p2p else None
        if options.crossnode_only and not self._crosses_nodes(group, peer):
            return func(*args, **kwargs)
        fqn, phase = self._where  # synced by __torch_dispatch__ just before
        timer = None
        if options.timing == "sync":
            if spec.is_p2p:
                # Waiting on a send before its matching receive is posted deadlocks rings
                # and pipeline schedules, and gloo's sends have no future to time them by.
                self._note("p2p", "timing='sync' does not time send/recv: waiting on each would change the program's order and can deadlock it")
            else:
                timer = SyncTimer(_on_cuda(args))
        nvtx = options.nvtx and _on_cuda(args)
        if nvtx:
            torch.cuda.nvtx.range_push(nvtx_label(spec.op, _ops.tensor_bytes(_ops.pick(spec.inputs, args, kwargs, None))[0], group, fqn))
        try:
            start_s = time.perf_counter() - self._t0  # when it was called
            if timer is not None:
                timer.start()
            try:
                out = func(*args, **kwargs)
            except Exception as e:  # recorded all the same, as failed
                event = self._record_collective(func, name, spec, args, kwargs, None, group, peer, fqn, phase, start_s)
                self._flight.failed(event.index, e)
                raise
            if timer is not None:
                timer.issued()
            # recorded before any wait: a collective that then hangs or raises is in the dump
            event = self._record_collective(func, name, spec, args, kwargs, out, group, peer, fqn, phase, start_s)
            if timer is not None:
                try:
                    timer.wait(lambda: _wait(out, spec, args, kwargs))
                except Exception as e:
                    self._flight.failed(event.index, e)
                    raise
                event = self.trace.update_event(event.index, latency_s=timer.seconds) or event
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()
        if self._async is not None and self._async.watch(group.name, self._groups.pg(group.name)):
            self._async.issued(group.name, self._groups.pg(group.name), event.index)  # timed later
        elif self._listeners:
            self._emit(event)
        return out

    def _record_collective(self, func, name: str, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict, out: Any, group: Any,
                peer: int | None, fqn: str, phase: str, start_s: float) -> CollectiveEvent:
        """Count one collective and keep its event; ``out`` is None when the call raised."""
        self.trace.add_group(group)
        inputs = _ops.pick(spec.inputs, args, kwargs, out)
        outputs = _ops.pick(spec.outputs, args, kwargs, out)
        in_bytes, in_shapes, dtype = _ops.tensor_bytes(inputs)
        out_bytes, out_shapes, out_dtype = _ops.tensor_bytes(outputs)
        size = _ops.MESSAGE_SIZE[spec.size](in_bytes, out_bytes, group.size)

        seq = p2p_seq = microbatch = None
        path = None
        if spec.is_p2p:
            key = (group.name, peer, spec.op)
            p2p_seq = self._p2p_seq[key]
            self._p2p_seq[key] = p2p_seq + 1
            tag = self._pipeline.pop(_first_tensor(inputs if inputs is not None else outputs))
            if tag is not None:
                # a pipelining schedule's send/recv: its phase and stage, not "outside any module"
                phase, microbatch = tag.phase, tag.microbatch
                if tag.module is not None:
                    path = self._tracker.path_of(tag.module)
                    fqn = path[-1]
        else:
            seq = self._seq[group.name]
            self._seq[group.name] = seq + 1
        if path is None:
            path = self._tracker.path(phase)
        self.trace.add_collective(path, phase, (spec.compat_key, spec.op, group.name), size)

        source, from_dtensor = self._caller()
        dt = self._last_dtensor if from_dtensor else None
        trace = self.trace
        index = trace.events_total
        # positional, in CollectiveEvent's field order: this runs for every collective
        event = CollectiveEvent(
            index,
            spec.op,
            spec.compat_key,
            name,
            trace.step,
            phase,
            fqn,
            group,
            seq,
            dtype or out_dtype,
            in_shapes,
            out_shapes,
            in_bytes,
            out_bytes,
            size,
            _busbw_factor(spec, group.size),
            None if dt is None else dt[0],
            None if dt is None else _text(dt[2], list),
            None if dt is None or dt[3] is None else _text(dt[3]),
            source if self.options.record_source else None,
            None,
            peer,
            p2p_seq,
            microbatch,
            start_s,
            False,
            None,
            self._tracker.unit,
        )
        trace.add_event(event)
        if out is not None:
            self._flight.issued(index, group.name, seq, out, outputs)
        return event

    # ---- in flight (hang detection) ----------------------------------------------------------

    def _wait(self, func, args: tuple, kwargs: dict):
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

    def in_flight(self, older_than_s: float = 0.0) -> list[tuple[CollectiveEvent, float]]:
        """Collectives issued and not finished for more than ``older_than_s`` seconds, with
        their age, oldest first (see :mod:`commdebug.capture.inflight` for what "finished"
        means). Safe to call from another thread; after the context ended, what was unfinished
        then."""
        unfinished = self._flight.unfinished(older_than_s) if self._active else [
            pair for pair in self._unfinished_at_exit if pair[1] >= older_than_s]
        stuck = []
        for index, age in unfinished:
            event = self.trace.event(index)
            if event is not None:
                stuck.append((event, age))
        return stuck

    def mark_in_flight(self, also: Iterable[int] = ()) -> list[CollectiveEvent]:
        """Flag the events of collectives not finished now (and clear the flag of those that
        finished since), so the next dump shows where the program is stuck. ``also``: event
        indices to flag anyway (a hang that ended in a timeout error: its Work reads completed)."""
        stuck = {e.index for e, _ in self.in_flight()} | set(also)
        marked = []
        for e in list(self.trace.events):
            if e.in_flight != (e.index in stuck):
                e = self.trace.update_event(e.index, in_flight=e.index in stuck) or e
            if e.in_flight:
                marked.append(e)
        return marked

    def _crosses_nodes(self, group: Any, peer: int | None) -> bool:
        """Whether a collective leaves the node: its group (or, for send/recv, its peer) spans
        more than one node of ``ranks_per_node`` consecutive ranks. Unknown ranks count as
        crossing: better recorded than lost."""
        per_node = self.options.ranks_per_node or 1
        if peer is not None:
            return peer // per_node != int(self.trace.metadata.get("rank") or 0) // per_node
        crosses = self._crosses.get(group.name)
        if crosses is None:
            ranks = group.ranks
            crosses = self._crosses[group.name] = ranks is None or len({r // per_node for r in ranks}) > 1
        return crosses

    def _note(self, key: str, message: str) -> None:
        """A fact about this run's timing, said once: logged and kept in the dump."""
        notes = self.trace.metadata.setdefault("timing_notes", [])
        if message not in notes:
            notes.append(message)
            log.warning("commdebug: %s", message)

    def _emit(self, event: CollectiveEvent) -> None:
        for listener in self._listeners:
            listener(event)

    def _join_timing(self) -> None:
        """Give asynchronously timed events their NCCL durations (step boundaries, exit, reads)."""
        if self._async is None:
            return

        def apply(index: int, started_at: float | None, seconds: float | None) -> None:
            start_s = None if started_at is None else started_at - self._t0_wall
            event = self.trace.update_event(index, start_s=start_s, latency_s=seconds)
            if event is not None and self._listeners:
                self._emit(event)

        self._async.join(apply)

    def _finish_timing(self) -> None:
        if self._async is None:
            return
        self._join_timing()
        self._async.__exit__()
        if self._listeners:  # never timed (not reported by NCCL): log them without a time
            for index in sorted(self._async.pending.values()):
                pos = index - self.trace.events_dropped
                if 0 <= pos < len(self.trace.events):
                    self._emit(self.trace.events[pos])
        self._async.pending.clear()

    @staticmethod
    def _peer(spec: _ops.CollectiveSpec, args: tuple, group: Any) -> int | None:
        """The other side of a send/recv as a global rank (ops carry the rank in the group)."""
        if spec.peer is None or spec.peer >= len(args):
            return None
        rank = int(args[spec.peer])
        ranks = group.ranks
        return ranks[rank] if ranks is not None and 0 <= rank < len(ranks) else rank

    @staticmethod
    def _caller() -> tuple[str | None, bool]:
        """The first frame of the user's code, and whether DTensor dispatch is on the way."""
        frame = sys._getframe(2)
        from_dtensor = False
        kind_of = _FRAME_KIND.get
        while frame is not None:
            code = frame.f_code
            kind = kind_of(code)
            if kind is None:
                kind = _FRAME_KIND[code] = _frame_kind(frame)
            if kind is _USER:
                return f"{code.co_filename}:{frame.f_lineno}", from_dtensor
            if kind is _DTENSOR:
                from_dtensor = True
            frame = frame.f_back
        return None, from_dtensor

    # ---- the reference's query API ----------------------------------------------------------

    def get_total_counts(self) -> int:
        """Number of collectives recorded."""
        return self.trace.summary()["collectives"]

    def get_comm_counts(self) -> dict[Any, int]:
        """Collective counts keyed like the reference: ``{torch.ops.c10d_functional.all_reduce: 2}``."""
        counts: dict[Any, int] = defaultdict(int)
        for phase in PHASES:
            for key, n in self.trace.collective_counts(GLOBAL, phase).items():
                counts[_ops.compat_key_packet(key)] += n
        return counts

    @property
    def comm_counts(self) -> dict[Any, int]:
        return self.get_comm_counts()

    @property
    def comm_module_counts(self) -> dict[str, dict[str, dict[Any, int]]]:
        """``{fqn: {"forward": {op: n}, "backward": {op: n}}}``, as the reference keeps it.

        As in the reference, ``backward`` includes activation-checkpoint recompute, and
        ``forward`` whatever ran outside backward, ``optimizer.step()`` included.
        """
        out: dict[str, dict[str, dict[Any, int]]] = {GLOBAL: {"forward": defaultdict(int), "backward": defaultdict(int)}}
        for (fqn, phase), bucket in self.trace.collectives.items():
            entry = out.setdefault(fqn, {"forward": defaultdict(int), "backward": defaultdict(int)})
            side = entry["backward" if phase in (BACKWARD, CHECKPOINT) else "forward"]
            for key, (count, _) in bucket.items():
                side[_ops.compat_key_packet(key[0])] += count
        return out

    @property
    def comm_module_operation_counts(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """``{fqn: {"operations_list": [op dict, ...]}}``; identical ops appear once with ``count``."""
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for fqn, _ in self.trace.walk():
            rows = []
            for phase in PHASES:
                for r in self.trace.operations(fqn, phase):
                    rows.append(
                        {
                            "name": r.name,
                            "input_shape": list(r.input_shape),
                            "input_sharding": list(r.input_sharding),
                            "device_mesh": r.device_mesh,
                            "is_bw": phase in (BACKWARD, CHECKPOINT),
                            "is_activation_checkpointing": phase == CHECKPOINT,
                            "count": r.count,
                        }
                    )
            if rows:
                out[fqn] = {"operations_list": rows}
        return out

    def get_parameter_info(self) -> dict[str, dict[str, Any]]:
        """``{module fqn: {parameter name: parameter data}}`` for every module that ran."""
        return {fqn: {name: p.data for name, p in params.items()} for fqn, params in self._params.items()}

    def get_sharding_info(self) -> dict[str, Any]:
        """``{"Module.sub.weight": placements}`` for every DTensor parameter."""
        return self._sharding

    @property
    def advanced_module_tracker(self) -> "_ReferenceTrackerView":
        """The reference's tracker dictionaries, for tests written against it."""
        return _ReferenceTrackerView(self)

    # ---- renderers (formatting lives in commdebug.render.table and commdebug.model.dump) ------------------

    def generate_comm_debug_tracing_table(self, noise_level: int = 3, *, color: bool | None = None) -> str:
        """The module tree with collectives per phase; ops by noise level 0-3 (see README). With a
        cluster (``cluster=``), levels 1-3 add each collective line's predicted time on it."""
        from commdebug.render.table import render_table

        return render_table(self.trace, noise_level, color=color, predicted=self._table_predictions(noise_level))

    def _table_predictions(self, noise_level: int) -> Any:
        """The table's predictions on this mode's cluster, computed now (when the table is asked
        for), never while recording; None at level 0 or without a cluster."""
        if noise_level < 1 or self.trace.metadata.get("cluster") is None:
            return None
        from commdebug.analysis.predicted import trace_predictions

        return trace_predictions(self.trace)

    def generate_summary_table(self, by: str = "op") -> str:
        """Per-op (or per ``"op,size"``, ``"op,bin"``, ``"module"``, ``"group"``, ``"step"``,
        ``"phase"``) counts, bytes and, when timed, times and bandwidths, with a header giving
        elapsed and communication time (docs/summary.md). Same text as ``commdebug summary``.

        >>> print(comm.generate_summary_table(by="op,size"))   # doctest: +SKIP
        """
        from commdebug.analysis.summary import summarize
        from commdebug.render.summary import render_summary

        self._join_timing()
        if self._active:  # inside the context: how long so far
            self.trace.metadata["elapsed_s"] = time.perf_counter() - self._t0
            self.trace.metadata["recorded_s"] = self._recorded_s + (0.0 if self._paused else time.perf_counter() - self._resumed_at)
        return render_summary(summarize(self.trace, by))

    def log_comm_debug_tracing_table_to_file(self, file_name: str = "comm_mode_log.txt", noise_level: int = 3) -> None:
        """Write the table, without colours, to ``file_name`` (atomically, folders created).

        ``{rank}`` and ``{world_size}`` in the name are replaced, so each rank writes its own:
        ``comm.log_comm_debug_tracing_table_to_file("logs/comm_rank{rank}.txt")``."""
        from commdebug.render.table import write_table

        write_table(self.trace, self._file_name(file_name), noise_level, predicted=self._table_predictions(noise_level))

    def generate_json_dump(self, file_name: str = "comm_mode_log.json", noise_level: int = 3) -> None:
        """Write the JSON dump (docs/json-format.md): the reference's format plus our section.

        ``{rank}`` and ``{world_size}`` in the name are replaced:
        ``comm.generate_json_dump("traces/rank{rank}.json")``."""
        from commdebug.model.dump import write_dump

        self.refresh_metadata()
        self._join_timing()
        self.trace.metadata["steps"] = self.trace.steps
        write_dump(self.trace, self._file_name(file_name), noise_level)

    def _file_name(self, name: str) -> str:
        from commdebug.fileio import expand_placeholders

        self.refresh_metadata()
        meta = self.trace.metadata
        return expand_placeholders(name, int(meta.get("rank") or 0), int(meta.get("world_size") or 1))

    def refresh_metadata(self) -> None:
        """Rank, world size and backend from torch.distributed, if it was initialised after the
        context was entered (a recording started before the program set up its process group)."""
        self.trace.metadata.update(distributed_metadata(self.trace.metadata))

    def __repr__(self) -> str:
        return f"CommDebugMode(get_total_counts()={self.get_total_counts()})"


class _ReferenceTrackerView:
    """Read-only dictionaries shaped like the reference's ``advanced_module_tracker``."""

    def __init__(self, mode: CommDebugMode) -> None:
        trace = mode.trace
        self.module_helper_dict: dict[str, dict[str, Any]] = {}
        self.parent_dict: dict[str, list[str]] = {}
        for fqn, depth in trace.walk():
            info = trace.modules[fqn]
            entry: dict[str, Any] = {"depth": depth}
            if fqn != GLOBAL:
                entry["module_type"] = info.module_type
            if info.parameters:
                entry["parameters"] = dict(info.parameters)
            self.module_helper_dict[fqn] = entry
            if info.children:
                self.parent_dict[fqn] = list(info.children)
        self.module_parameters_dict = mode.get_parameter_info()
        self.sharding_dict = mode.get_sharding_info()


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


def _on_cuda(args: tuple) -> bool:
    return torch.cuda.is_available() and any(t.is_cuda for t in tensors(args))


def _wait(out: Any, spec: _ops.CollectiveSpec, args: tuple, kwargs: dict) -> None:
    """Block until the collective that produced ``out`` has finished."""
    waited = False
    for item in out if isinstance(out, (tuple, list)) else (out,):
        if hasattr(item, "wait") and not isinstance(item, torch.Tensor):
            item.wait()  # c10d Work
            waited = True
    if not waited:
        result = _ops.pick(spec.outputs, args, kwargs, out)
        for t in tensors(result if result is not None else out):
            torch.ops._c10d_functional.wait_tensor(t)


def _first_tensor(value: Any) -> torch.Tensor | None:
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, torch.Tensor) else None

