"""Which collectives are still running, and which failed: for the hang watchdog, for dumps written
at a hang, and for collectives that raise after they were issued.

A collective counts as finished when any of these happened:

- its ``Work.wait()`` returned (``Work.wait`` is wrapped while a recording is active; the
  synchronous c10d calls wait through it too),
- its ``Work`` reads ``is_completed()`` and did not fail,
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

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from commdebug.capture import unseen
from commdebug.model.trace import CollectiveEvent, Trace

__all__ = ["FlightViews", "InFlight", "SYNCED", "work_of", "tensors", "wait_until_finished", "work_patch"]

# Work objects of collectives nobody waited for (fire-and-forget isend, a program that drops
# its handles) are let go of beyond this many, oldest first: a Work holds buffers.
_MAX_TRACKED = 4096
_SCAN_AT = 256  # tracked calls that make the capture path forget the finished ones

# An entry, for every collective tracked: (event index, monotonic time issued, group name,
# seq or None, Work or None, storage keys of the output tensors whose wait finishes it).


class InFlight:
    """The collectives of one recording that were issued and have not finished.

    The capture path runs for every collective and every wait, so the two common shapes (a
    functional collective with one output, waited by ``wait_tensor``; an eager one with a Work,
    waited by ``Work.wait``) cost one dict operation on issue and one on wait, without a lock:
    each dict operation is atomic under the GIL, and the watchdog thread only reads them whole.
    Everything else (several outputs, an eager call without a Work, an output whose storage a
    later collective reused before anybody waited for it) goes to tables kept under the lock.

    >>> flight = InFlight(on_error=lambda index, text: ..., on_waited=lambda index: ...)   # doctest: +SKIP
    >>> flight.issued(7, "0", 3, out, outputs)                         # doctest: +SKIP
    >>> flight.unfinished(older_than_s=60)   # [(7, 61.2)] while it hangs   # doctest: +SKIP
    """

    def __init__(self, on_error: Callable[[int, str], None], on_waited: Callable[[int], None] | None = None) -> None:
        self._on_error = on_error
        self._on_waited = on_waited  # the program's own wait for collective `index` returned
        self._by_storage: dict[int, tuple] = {}  # storage key of a single output -> entry
        self._by_work: dict[int, tuple] = {}  # _work_key(Work) -> entry (which holds the Work: no key reuse)
        self._lock = threading.Lock()  # for the tables below
        self._others: dict[int, tuple] = {}  # event index -> entry
        self._others_by_tensor: dict[int, int] = {}  # storage key -> event index
        self._finished_seq: dict[str, int] = {}  # group -> highest seq known finished
        self._scan_at = _SCAN_AT

    # ---- the capture side ---------------------------------------------------------------------

    def issued(self, index: int, group: str, seq: int | None, out: Any, outputs: Any) -> None:
        """A collective was just issued: ``out`` is what the op returned, ``outputs`` its
        output tensors (a functional collective finishes when one of them is waited for)."""
        target = outputs if outputs is not None else out
        if isinstance(out, torch.Tensor):  # a functional collective's output: no Work to find
            if isinstance(target, torch.Tensor):
                self.tensor_issued(index, group, seq, _storage_key(target))
                return
            else:
                self._keep((index, time.monotonic(), group, seq, None, tuple(_storage_key(t) for t in tensors(target))))
        else:
            work = work_of(out)
            if work is SYNCED:  # finished before the call returned: nothing to wait for
                self.done(group, seq)
                return
            if work is not None:
                self.work_issued(index, group, seq, _work_key(work), work)
                return
            self._keep((index, time.monotonic(), group, seq, None, tuple(_storage_key(t) for t in tensors(target))))
        self._bound()

    def tensor_issued(self, index: int, group: str, seq: int | None, key: int) -> None:
        """A functional collective issued, whose one output's wait ``key`` names
        (:func:`_storage_key`)."""
        by_storage = self._by_storage
        earlier = by_storage.get(key)
        by_storage[key] = (index, time.monotonic(), group, seq, None, (key,))
        if earlier is not None:  # its storage was freed and reused before its wait
            self._keep(earlier)
        if len(by_storage) + len(self._by_work) > self._scan_at:
            self._bound()

    def work_issued(self, index: int, group: str, seq: int | None, key: int, work: Any) -> None:
        """An eager collective returned ``work`` (a Work, or light capture's C++ kernel's
        holder of one: anything with ``is_completed()``), whose wait ``key`` names
        (:func:`_work_key`)."""
        self._by_work[key] = (index, time.monotonic(), group, seq, work, ())
        if len(self._by_storage) + len(self._by_work) > self._scan_at:
            self._bound()

    def _bound(self) -> None:
        """Forget the finished calls once the tables pass their bound (the callers on the
        capture path test it first: a call is cheaper than this, but not free)."""
        if len(self._by_storage) + len(self._by_work) > self._scan_at:
            with self._lock:
                self._scan()

    def done(self, group: str, seq: int | None) -> None:
        """A collective finished as it was issued: the calls before it on its group did too."""
        if seq is not None and seq > self._finished_seq.get(group, -1):
            self._finished_seq[group] = seq

    def work_waited(self, work: Any, error: BaseException | None = None) -> None:
        """``work.wait()`` returned (or raised ``error``)."""
        if error is not None:
            unseen.mark(error)
        entry = self._by_work.pop(_work_key(work), None)
        if entry is not None:
            self._ended(entry, error)

    def tensor_waited(self, tensor: Any, error: BaseException | None = None) -> None:
        """``wait_tensor(tensor)`` returned (or raised ``error``)."""
        if error is not None:
            unseen.mark(error)
        key = _storage_key(tensor)
        entry = self._by_storage.pop(key, None)
        if entry is None and self._others_by_tensor:
            with self._lock:
                index = self._others_by_tensor.get(key)
                entry = self._drop_other(index) if index is not None else None
        if entry is not None:
            self._ended(entry, error)

    def finished(self, index: int) -> None:
        """The mode itself waited for collective ``index`` to finish (``timing='sync'``)."""
        with self._lock:
            entry = self._drop(index)
        if entry is not None:
            self.done(entry[2], entry[3])

    def failed(self, index: int, error: BaseException) -> None:
        """The collective raised ``error`` (in its call, or where the mode itself waited for it)."""
        unseen.mark(error)
        with self._lock:
            entry = self._drop(index)
        if entry is not None:
            self.done(entry[2], entry[3])
        self._on_error(index, _describe(error))

    def clear(self) -> None:
        """Let go of every Work and tensor id (the recording ended)."""
        with self._lock:
            self._by_storage.clear()
            self._by_work.clear()
            self._others.clear()
            self._others_by_tensor.clear()

    # ---- the watchdog side ----------------------------------------------------------------

    def unfinished(self, older_than_s: float = 0.0) -> list[tuple[int, float]]:
        """(event index, age in seconds) of the collectives issued more than ``older_than_s``
        ago and not finished, oldest first. Safe to call from another thread."""
        now = time.monotonic()
        with self._lock:
            self._forget_finished()
            stuck = [(entry[0], now - entry[1]) for entry in self._entries() if now - entry[1] >= older_than_s]
        return sorted(stuck, key=lambda pair: -pair[1])

    # ---- internals ----------------------------------------------------------------------------

    def _ended(self, entry: tuple, error: BaseException | None) -> None:
        self.done(entry[2], entry[3])
        if error is not None:
            self._on_error(entry[0], _describe(error))
        elif self._on_waited is not None:
            self._on_waited(entry[0])

    def _keep(self, entry: tuple) -> None:
        """Track ``entry`` in the tables kept under the lock."""
        with self._lock:
            self._others[entry[0]] = entry
            for key in entry[5]:
                self._others_by_tensor[key] = entry[0]
            if len(self._others) > self._scan_at:
                self._scan()

    def _scan(self) -> None:
        self._forget_finished()
        # calls nobody waits for pile up: scan again only once their number has doubled, so the
        # capture path never pays a scan per collective
        self._scan_at = max(_SCAN_AT, 2 * len(self._entries()))

    def _drop_other(self, index: int) -> tuple | None:
        entry = self._others.pop(index, None)
        if entry is not None:
            for key in entry[5]:
                if self._others_by_tensor.get(key) == index:
                    del self._others_by_tensor[key]
        return entry

    def _entries(self) -> list[tuple]:
        # list() of a dict's values is one step under the GIL: safe while the program writes
        return [*list(self._by_storage.values()), *list(self._by_work.values()), *list(self._others.values())]

    def _drop(self, index: int) -> tuple | None:
        """Stop tracking collective ``index``, wherever it is (under the lock)."""
        for table in (self._by_storage, self._by_work):
            for key, entry in list(table.items()):
                if entry[0] == index:
                    return _pop_if(table, key, entry)
        return self._drop_other(index)

    def _forget_finished(self) -> None:
        """Drop what finished without a wait we saw: a Work that reads completed, a call older
        than one its group finished since (under the lock)."""
        finished = self._finished_seq
        for table in (self._by_storage, self._by_work):
            for key, entry in list(table.items()):
                _, _, group, seq, work, _ = entry
                if (work is not None and _completed(work)) or (seq is not None and seq < finished.get(group, -1)):
                    _pop_if(table, key, entry)
        for index, entry in list(self._others.items()):
            _, _, group, seq, work, _ = entry
            if seq is not None and seq < finished.get(group, -1):
                self._drop_other(index)
        tracked: list[tuple[tuple, dict[int, tuple] | None, int]] = [
            (entry, table, key) for table in (self._by_storage, self._by_work) for key, entry in list(table.items())]
        tracked += [(entry, None, index) for index, entry in list(self._others.items())]
        if len(tracked) > _MAX_TRACKED:  # the oldest go
            tracked.sort(key=lambda item: item[0][0])
            for entry, home, key in tracked[: len(tracked) - _MAX_TRACKED]:
                if home is None:
                    self._drop_other(key)
                else:
                    _pop_if(home, key, entry)


def _pop_if(table: dict[int, tuple], key: int, entry: tuple) -> tuple | None:
    """Remove ``table[key]`` if it is still ``entry``. The program may replace it meanwhile (a
    new collective on a reused buffer), and the GIL can switch threads between the two steps:
    then the new one is lost to the watchdog, which can miss a hang but never invents one (the
    other order, pop first and put back, could lose a wait and report a finished call hung)."""
    if table.get(key) is entry:
        return table.pop(key, None)
    return None


def _storage_key(t: torch.Tensor) -> int:
    """What a wait on ``t`` or on any view of it finds: its storage (as c10d's work registry
    does); the tensor itself where there is no real storage (meta and fake tensors)."""
    if type(t) is torch.Tensor:  # the common case, first
        if _native_storage_key is not None:
            return _native_storage_key(t)  # the same, without making the storage's Python object
        try:
            return t.untyped_storage().data_ptr() or id(t)
        except Exception:
            return id(t)
    # an AsyncCollectiveTensor holds the collective's output; asking a wrapper subclass for its
    # storage raises, which costs more than the rest of the bookkeeping
    inner = getattr(t, "elem", None)
    if isinstance(inner, torch.Tensor):
        t = inner
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        ptr = 0
    return ptr if ptr else id(t)


def _completed(work: Any) -> bool:
    """``work`` finished, and without an error. A Work that failed (a peer closed the connection)
    reads completed as well, but its call did not complete on every member, and ``check`` takes a
    finished call as proof that every member issued it: a failed call stays in flight until its
    wait raises and says how it failed."""
    try:
        return bool(work.is_completed()) and not _failed(work)
    except Exception:
        return False


def _failed_by_future(work: Any) -> bool:
    """Without the extension: the Work's future holds its error (the binding's ``exception``
    and ``is_success`` warn on every call that they are deprecated; NCCL's ``is_success``
    raises)."""
    try:
        future = work.get_future()
    except Exception:  # no future (a stand-in, a backend without one): nothing says it failed
        return False
    if not future.done():
        return False
    try:
        future.value()
    except Exception:
        return True
    return False


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


# What work_of returns for an eager op the backend finished before returning: NCCL, called with
# async_op=False (as torch.distributed's functions are when not asked for async), makes the
# current stream wait for the collective and returns an empty Work (measured on an H100,
# torch 2.11, NCCL 2.28). Waiting on that object crashes the process.
SYNCED = object()


# What the in-flight table keys a Work by (_work_key) and a tensor's storage by (_storage_key)
# where light capture's C++ extension is built: the address of a Python Work's c10d Work (its
# kernel tracks a call by that, with no Python Work made), and a storage's address without
# making the storage's Python object. Elsewhere the Python Work's id, and the storage object.
# Either way the Python Work a wait gets, or the tensor it waits on, gives its call's key.
_work_key: Callable[[Any], int]
_native_storage_key: Callable[[torch.Tensor], int] | None
_failed: Callable[[Any], bool]
try:
    from commdebug.capture._native import (
        storage_key as _native_storage_key,
        work_failed as _failed,
        work_key as _work_key,
    )
except ImportError:
    _work_key, _native_storage_key, _failed = id, None, _failed_by_future


def _unbox(item: Any) -> Any:
    return dist.distributed_c10d.Work.unbox(item)


_SCRIPT_OBJECT = torch.ScriptObject


def work_of(out: Any) -> Any:
    """The c10d Work an eager op returned (alone or after its tensors), :data:`SYNCED` for an
    empty one (the backend synchronised in the call), or None."""
    # eager c10d ops return (tensors, Work), the Work last: looked at first
    items = out if type(out) is tuple or type(out) is list else (out,)
    for item in reversed(items):
        if isinstance(item, _SCRIPT_OBJECT):
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


def _unseen(error: BaseException) -> None:
    """Take the wrapper that catches ``error`` out of its traceback before it is raised on: the
    program's traceback ends at torch's call to ``wait`` as it would without commdebug
    (docs/ranks.md). A bare ``raise`` then adds no entry for the wrapper's frame (Python 3.11+,
    where it raises the error with the traceback it carries)."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1):
        error.__traceback__ = tb.tb_next


def _wrap_wait(original: Any, patch: Any) -> Any:
    users = patch.users  # the recordings' InFlights; the list object is kept, so it stays current

    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original(work, *args, **kwargs)
        except BaseException as e:
            for flight in list(users):
                flight.work_waited(work, e)
            _unseen(e)
            raise
        if len(users) == 1:  # one recording: no copy of the list (every eager collective waits here)
            try:
                flight = users[0]
            except IndexError:  # its recording ended meanwhile, on another thread
                return result
            flight.work_waited(work)
        else:
            for flight in list(users):
                flight.work_waited(work)
        return result

    return wait


def _tell(flights: list[InFlight], tensor: torch.Tensor) -> None:
    """Every recording's InFlight that ``tensor`` was waited for (mostly there is one). Where
    the C++ extension is built, its ``waited`` does this, the common case without a Python
    frame (commdebug/capture/_native.cpp)."""
    if len(flights) == 1:
        flights[0].tensor_waited(tensor)
        return
    for flight in list(flights):
        flight.tensor_waited(tensor)


def _teller() -> Callable[[list[InFlight], torch.Tensor], None]:
    from commdebug.capture import light

    return getattr(light._native, "waited", None) or _tell


def _wrap_trigger_wait(original: Any, patch: Any) -> Any:
    from commdebug.capture import light

    tell = _teller()

    def trigger_wait(act: Any, *args: Any, **kwargs: Any) -> Any:
        first = not getattr(act, "completed", True)
        # this wrapper finishes the collective: the wait_tensor inside need not pass through
        # light capture's kernel, whose boxing costs more than the rest of a wait
        skipped = light.skip()
        try:
            result = original(act, *args, **kwargs)
        except BaseException as e:
            light.unskip(skipped)
            _unseen(e)
            raise
        light.unskip(skipped)
        if first:
            tell(patch.users, act.elem)
        return result

    return trigger_wait


def _wrap_act_wait(original: Any, patch: Any) -> Any:
    from commdebug.capture import light

    tell = _teller()

    def wait(act: Any, *args: Any, **kwargs: Any) -> Any:
        skipped = light.skip()  # as in trigger_wait: this wrapper finishes the collective
        try:
            result = original(act, *args, **kwargs)
        except BaseException as e:
            light.unskip(skipped)
            _unseen(e)
            raise
        light.unskip(skipped)
        tell(patch.users, act.elem)
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


class FlightViews:
    """The recorder's collectives in flight as its events (a mixin of
    :class:`commdebug.capture.recorder.Recorder`, which sets the attributes below)."""

    trace: Trace
    _flight: InFlight
    _active: bool
    _unfinished_at_exit: list[tuple[int, float]]

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
