"""Which collectives are still running, and which failed: for the hang watchdog, for dumps written
at a hang, and for collectives that raise after they were issued.

A collective counts as finished when any of these happened:

- its ``Work.wait()`` returned (``Work.wait`` is wrapped while a recording is active; the
  synchronous c10d calls wait through it too),
- its ``Work`` reads ``is_completed()``,
- its output, or a view of it, was waited for (functional collectives: ``wait_tensor``, also
  when ``AsyncCollectiveTensor`` waits from inside another op's dispatch, where no dispatch
  mode sees it: its ``trigger_wait``/``wait`` are wrapped too),
- a later collective on the same group finished: every member of the group issued this one
  before that one, so it is no hang on the others.

No single backend flag decides: gloo's ``reduce_scatter_tensor`` Work keeps reading
``is_completed() == False`` after ``wait()`` returned, and has no future to ask, so trusting the
flag made every healthy FSDP2 job look hung. A ``wait()`` that raises (a peer closed the
connection, a timeout) marks the collective failed, with the error text.

Nothing here is formatted or written: the mode asks :meth:`InFlight.unfinished` and hands the
errors to the trace through the ``on_error`` callback.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["InFlight", "SYNCED", "work_of", "tensors", "wait_until_finished", "work_patch"]

# what the in-flight log records (InFlight._log)
_ISSUED, _TENSOR_WAITED, _WORK_WAITED, _DONE = "issued", "tensor waited", "work waited", "done"
_FOLD_AT = 512  # log entries that make the capture path fold them in
# Work objects of collectives nobody waited for (fire-and-forget isend, a program that drops
# its handles) are let go of beyond this many, oldest first: a Work holds buffers.
_MAX_TRACKED = 4096


class InFlight:
    """The collectives of one recording that were issued and have not finished.

    >>> flight = InFlight(on_error=lambda index, text: ...)          # doctest: +SKIP
    >>> flight.issued(7, "0", 3, out, outputs)                         # doctest: +SKIP
    >>> flight.unfinished(older_than_s=60)   # [(7, 61.2)] while it hangs   # doctest: +SKIP
    """

    def __init__(self, on_error: Callable[[int, str], None]) -> None:
        self._on_error = on_error
        self._lock = threading.Lock()  # the watchdog thread reads while the program writes
        # what happened since the tables were last brought up to date, in order: the capture
        # path only appends (one list append per issue or wait); whoever reads folds it in
        # (`_fold`), also every _FOLD_AT entries
        self._log: list[tuple] = []
        # event index -> (monotonic time issued, group name, seq or None, Work or None, ids of
        # the output tensors whose wait finishes it)
        self._issued: dict[int, tuple[float, str, int | None, Any, tuple[int, ...]]] = {}
        self._by_work: dict[int, int] = {}  # id(Work) -> event index (the Work is held in _issued)
        self._by_tensor: dict[int, int] = {}  # storage of a functional output -> event index
        self._finished_seq: dict[str, int] = {}  # group -> highest seq known finished
        self._scan_at = 256  # how many tracked calls make a fold forget the finished ones

    # ---- the capture side: appends only -----------------------------------------------------

    def issued(self, index: int, group: str, seq: int | None, out: Any, outputs: Any) -> None:
        """A collective was just issued: ``out`` is what the op returned, ``outputs`` its
        output tensors (a functional collective finishes when one of them is waited for)."""
        target = outputs if outputs is not None else out
        if isinstance(out, torch.Tensor):  # a functional collective's output: no Work to find
            work = None
            ids = (_storage_key(target),) if isinstance(target, torch.Tensor) else tuple(_storage_key(t) for t in tensors(target))
        else:
            work = work_of(out)
            if work is SYNCED:  # finished before the call returned: nothing to wait for
                self.done(group, seq)
                return
            ids = () if work is not None else tuple(_storage_key(t) for t in tensors(target))
        log = self._log
        log.append((_ISSUED, index, time.monotonic(), group, seq, work, ids))
        if len(log) > _FOLD_AT:
            self._fold()

    def done(self, group: str, seq: int | None) -> None:
        """A collective finished as it was issued: the calls before it on its group did too."""
        if seq is not None:
            self._log.append((_DONE, group, seq))

    def work_waited(self, work: Any, error: BaseException | None = None) -> None:
        """``work.wait()`` returned (or raised ``error``)."""
        log = self._log
        log.append((_WORK_WAITED, id(work)))
        if error is not None or len(log) > _FOLD_AT:
            self._fold_after_wait(self._by_work, id(work), error)

    def tensor_waited(self, tensor: Any, error: BaseException | None = None) -> None:
        """``wait_tensor(tensor)`` returned (or raised ``error``)."""
        key = _storage_key(tensor)
        log = self._log
        log.append((_TENSOR_WAITED, key))
        if error is not None or len(log) > _FOLD_AT:
            self._fold_after_wait(self._by_tensor, key, error)

    def failed(self, index: int, error: BaseException) -> None:
        """The collective raised where the mode itself waited for it (``timing='sync'``)."""
        with self._lock:
            self._fold_locked()
            self._finish(index)
        self._on_error(index, _describe(error))

    def _fold_after_wait(self, table: dict[int, int], key: int, error: BaseException | None) -> None:
        with self._lock:
            # the wait itself is in the log: which collective it finished is known once folded
            index = self._fold_locked(table, key)
        if index is not None and error is not None:
            self._on_error(index, _describe(error))

    def clear(self) -> None:
        """Let go of every Work and tensor id (the recording ended)."""
        with self._lock:
            self._log.clear()
            self._issued.clear()
            self._by_work.clear()
            self._by_tensor.clear()

    # ---- the watchdog side ----------------------------------------------------------------

    def unfinished(self, older_than_s: float = 0.0) -> list[tuple[int, float]]:
        """(event index, age in seconds) of the collectives issued more than ``older_than_s``
        ago and not finished, oldest first. Safe to call from another thread."""
        now = time.monotonic()
        with self._lock:
            self._fold_locked()
            self._forget_finished()
            stuck = [(index, now - entry[0]) for index, entry in self._issued.items() if now - entry[0] >= older_than_s]
        return sorted(stuck, key=lambda pair: -pair[1])

    # ---- internals (under the lock) ---------------------------------------------------------

    def _fold(self) -> None:
        with self._lock:
            self._fold_locked()

    def _fold_locked(self, table: dict[int, int] | None = None, key: int | None = None) -> int | None:
        """Apply the log to the tables, in order (a storage freed and reused by a later
        collective's output is told apart by that order). Returns the index the last wait on
        ``key`` in ``table`` finished, if asked."""
        log = self._log
        n = len(log)  # entries appended meanwhile (another thread) stay for the next fold
        found = None
        # A functional collective is mostly waited for soon after it is issued, in the same
        # stretch of log: such pairs cancel here without touching the tables.
        fresh: dict[int, tuple] = {}  # storage key -> issued entry of this stretch, not waited yet
        for entry in log[:n]:
            kind = entry[0]
            if kind is _TENSOR_WAITED or kind is _WORK_WAITED:
                waits = self._by_tensor if kind is _TENSOR_WAITED else self._by_work
                issued = fresh.pop(entry[1], None) if kind is _TENSOR_WAITED else None
                if issued is not None:
                    index = issued[1]
                    self._seq_finished(issued[3], issued[4])
                else:
                    index = waits.pop(entry[1], None)
                    if index is not None:
                        self._finish(index)
                if index is not None and waits is table and entry[1] == key:
                    found = index
            elif kind is _ISSUED:
                ids = entry[6]
                if len(ids) == 1 and entry[5] is None:
                    earlier = fresh.pop(ids[0], None)  # its storage was freed and reused
                    if earlier is not None:
                        self._track(earlier)
                    fresh[ids[0]] = entry
                else:
                    self._track(entry)
            else:  # _DONE
                self._seq_finished(entry[1], entry[2])
        for entry in fresh.values():
            self._track(entry)
        del log[:n]
        return found

    def _track(self, entry: tuple) -> None:
        """An issued collective goes into the tables, to be found by its wait."""
        _, index, at, group, seq, work, ids = entry
        self._issued[index] = (at, group, seq, work, ids)
        if work is not None:
            self._by_work[id(work)] = index
        for i in ids:
            self._by_tensor[i] = index
        if len(self._issued) > self._scan_at:
            self._forget_finished()
            # calls nobody waits for pile up: scan again only once their number has doubled,
            # so folding never pays a scan per collective
            self._scan_at = max(256, 2 * len(self._issued))

    def _finish(self, index: int) -> None:
        entry = self._issued.pop(index, None)
        if entry is None:
            return
        _, group, seq, work, ids = entry
        if work is not None:
            self._by_work.pop(id(work), None)
        for i in ids:
            if self._by_tensor.get(i) == index:
                del self._by_tensor[i]
        self._seq_finished(group, seq)

    def _seq_finished(self, group: str, seq: int | None) -> None:
        """Call ``seq`` on ``group`` finished: so did the ones before it."""
        if seq is not None and seq > self._finished_seq.get(group, -1):
            self._finished_seq[group] = seq

    def _forget_finished(self) -> None:
        for index, entry in list(self._issued.items()):
            if entry[3] is not None and _completed(entry[3]):
                self._finish(index)
        for index, (_, group, seq, _, _) in list(self._issued.items()):
            if seq is not None and seq < self._finished_seq.get(group, -1):
                self._finish(index)  # a later call on its group finished
        while len(self._issued) > _MAX_TRACKED:
            self._finish(next(iter(self._issued)))


def _storage_key(t: torch.Tensor) -> int:
    """What a wait on ``t`` or on any view of it finds: its storage (as c10d's work registry
    does); the tensor itself where there is no real storage (meta and fake tensors)."""
    if type(t) is not torch.Tensor:
        # an AsyncCollectiveTensor holds the collective's output; asking a wrapper subclass
        # for its storage raises, which costs more than the rest of the bookkeeping
        inner = getattr(t, "elem", None)
        if isinstance(inner, torch.Tensor):
            t = inner
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        ptr = 0
    return ptr if ptr else id(t)


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


# What work_of returns for an eager op the backend finished before returning: NCCL, called with
# async_op=False (as torch.distributed's functions are when not asked for async), makes the
# current stream wait for the collective and returns an empty Work (measured on an H100,
# torch 2.11, NCCL 2.28). Waiting on that object crashes the process.
SYNCED = object()


def _unbox(item: Any) -> Any:
    return dist.distributed_c10d.Work.unbox(item)


def work_of(out: Any) -> Any:
    """The c10d Work an eager op returned (alone or after its tensors), :data:`SYNCED` for an
    empty one (the backend synchronised in the call), or None."""
    for item in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(item, torch.ScriptObject):
            try:
                work = _unbox(item)
            except Exception:
                return None
            return SYNCED if work is None else work
    return None


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's argument or result (nested lists and tuples flattened)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


def wait_until_finished(out: Any, spec: Any, args: tuple, kwargs: dict) -> None:
    """Block until the collective that produced ``out`` (described by its ops.py ``spec``) has
    finished: its Work's ``wait()``, or ``wait_tensor`` on a functional collective's outputs."""
    from commdebug import ops as _ops

    work = work_of(out)
    if work is SYNCED:
        return  # the call returned with it done (on CUDA, the current stream waits for it)
    if work is not None:
        work.wait()
    else:
        result = _ops.pick(spec.outputs, args, kwargs, out)
        for t in tensors(result if result is not None else out):
            torch.ops._c10d_functional.wait_tensor(t)


def _wrap_wait(original: Any, patch: Any) -> Any:
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original(work, *args, **kwargs)
        except BaseException as e:
            for flight in list(patch.users):
                flight.work_waited(work, e)
            raise
        for flight in list(patch.users):
            flight.work_waited(work)
        return result

    return wait


def _tell(flights: list[InFlight], tensor: torch.Tensor) -> None:
    """Every recording's InFlight that ``tensor`` was waited for (mostly there is one)."""
    if len(flights) == 1:
        flights[0].tensor_waited(tensor)
        return
    for flight in list(flights):
        flight.tensor_waited(tensor)


def _wrap_trigger_wait(original: Any, patch: Any) -> Any:
    from commdebug.capture import light

    def trigger_wait(act: Any, *args: Any, **kwargs: Any) -> Any:
        first = not getattr(act, "completed", True)
        # this wrapper finishes the collective: the wait_tensor inside need not pass through
        # light capture's kernel, whose boxing costs more than the rest of a wait
        skipped = light.skip()
        try:
            result = original(act, *args, **kwargs)
        finally:
            light.unskip(skipped)
        if first:
            _tell(patch.users, act.elem)
        return result

    return trigger_wait


def _wrap_act_wait(original: Any, patch: Any) -> Any:
    from commdebug.capture import light

    def wait(act: Any, *args: Any, **kwargs: Any) -> Any:
        skipped = light.skip()  # as in trigger_wait: this wrapper finishes the collective
        try:
            result = original(act, *args, **kwargs)
        finally:
            light.unskip(skipped)
        _tell(patch.users, act.elem)
        return result

    return wait


class _WaitPatches:
    """The waits that tell a collective finished, wrapped once for all recordings: ``Work.wait``
    on the base class and on the subclasses that define their own (the fake backend's
    ``FakeWork``), and ``AsyncCollectiveTensor``'s waits, which run inside other ops' dispatch
    where the recording's dispatch mode is off."""

    def __init__(self) -> None:
        from commdebug.capture.patches import ClassPatch

        self.patches = [ClassPatch("torch._C._distributed_c10d", name, {"wait": _wrap_wait}) for name in ("Work", "FakeWork")]
        self.patches.append(ClassPatch("torch.distributed._functional_collectives", "AsyncCollectiveTensor",
                                       {"trigger_wait": _wrap_trigger_wait, "wait": _wrap_act_wait}))

    def add(self, flight: InFlight) -> None:
        for patch in self.patches:
            patch.add(flight)

    def remove(self, flight: InFlight) -> None:
        for patch in self.patches:
            patch.remove(flight)


def work_patch() -> _WaitPatches:
    """The one wrapper of ``Work.wait`` shared by all recordings (see :class:`ClassPatch`)."""
    global _WORK_WAIT
    if _WORK_WAIT is None:
        _WORK_WAIT = _WaitPatches()
    return _WORK_WAIT


_WORK_WAIT: _WaitPatches | None = None
