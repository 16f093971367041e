"""Light capture's module tracking: the location of a collective without a hook on any module.

The full capture needs the location of every op, so its tracker keeps it current with hooks
(:mod:`commdebug.capture.tracker`). Any module hook sends every module call down the slow path of
``Module._call_impl``, and the backward markers cost more again: about 25 us per module call on
the TP transformer, more than all its collectives cost to record. Light capture needs the
location only when a collective runs, so it keeps less and works the rest out then:

- forward: ``Module.__call__`` is wrapped while a light step runs (``MODULE_CALL``), and the
  wrapper keeps the tracker's stack of running modules. The module's own hooks run inside the
  wrapper, so the all-gathers of its pre-hooks and the redistributions of its forward hooks
  belong to it, as under the full capture.
- backward: every autograd node takes a sequence number from a per-thread counter when it is
  made. As each module call made with gradients enabled starts, the wrapper logs the counter
  and the module's path, and as it ends, the counter and None: four list appends, worked into
  ranges only when a backward collective asks (:class:`NodeRanges`). A collective issued while
  autograd runs node N belongs to the innermost module call whose range holds N's number: the
  module whose forward made N. Tensor hooks run as part of the node that takes their gradient,
  so FSDP2's pre-backward unshard belongs to the module that made its output's node. Outside
  any node (an engine callback, FSDP2's final callback) the tracker's state decides, as in the
  full capture.

Where :mod:`commdebug.capture._native` is built, the wrapper's common case runs in C
(``_native.ModuleCalls``): a module seen before under the same parent, with a parent running
and the log below its cap, is pushed, logged, called and popped without Python bytecode; the
Python function Dynamo reads stays in front of it (one check of whether Dynamo is tracing),
and every other call goes to :meth:`CallTracking._call`, which decides as before.

Limits: the counter is per thread, so a forward run on several threads at once may misplace
backward collectives; ``AccumulateGrad`` nodes have no number in any range (DDP's reducer
all-reduces from their hooks), so those go where the tracker's state says.
"""

from __future__ import annotations

import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

import torch

from commdebug.capture.patches import ClassPatch
from commdebug.capture.source import in_compiled_code
from commdebug.model.trace import GLOBAL

if TYPE_CHECKING:
    from torch.autograd.graph import Node

_native: ModuleType | None
try:
    from commdebug.capture import _native  # the module-call wrapper's common case in C
except ImportError:  # not built: all of it in Python
    _native = None

__all__ = ["LOG_CAP", "MODULE_CALL", "CallTracking", "NodeRanges", "current_node", "hidden", "nested_call", "next_number"]

# the number the next autograd node made on this thread will take
next_number = torch._C._autograd._get_sequence_nr
_graph_task_id = torch._C._current_graph_task_id
_compiler = torch.compiler
_dynamo_compiling = torch.compiler.is_dynamo_compiling
# the autograd node running now; torch's stub says it returns a Node, but outside a backward
# (or between nodes) it returns None
current_node: Callable[[], Node | None] = torch._C._current_autograd_node
_grad_enabled = torch.is_grad_enabled
_ROOT = (GLOBAL,)
_OPEN = 1 << 64  # above every sequence number, AccumulateGrad's UINT64_MAX included
_CAP = 1 << 16  # records kept; the oldest half goes past this (forwards with no step boundary)
LOG_CAP = 1 << 13  # log items a module call folds before it logs (forwards with no backward)


class NodeRanges:
    """The autograd sequence numbers made inside each module call, to find the call behind a node.

    A module call costs four appends to :attr:`log`, a flat list of pairs (the counter and the
    module's path as the call starts, the counter and None as it ends): a light step makes one
    for every module call, and most steps look up far fewer nodes than they make calls. Flat,
    because a pair kept as a tuple is an object the garbage collector then visits at every
    collection until the step ends (0.15 us a module call, measured). The ranges are worked
    out from the log when :meth:`find` or :meth:`clear` next runs. Calls nest (each ends
    before its caller does), so an end closes the innermost open call.

    >>> ranges = NodeRanges()
    >>> ranges.log += (next_number(), ("Global", "Model"))   # doctest: +SKIP
    >>> ranges.log += (next_number(), None)                   # doctest: +SKIP
    >>> ranges.find(node._sequence_nr())                      # doctest: +SKIP
    ('Global', 'Model')
    """

    __slots__ = ("log", "starts", "ends", "paths", "parents", "_open")

    def __init__(self) -> None:
        self.log: list[int | tuple[str, ...] | None] = []  # number, path or None, ...: not folded yet
        self.starts: list[int] = []  # ascending: calls open in order and the counter only grows
        self.ends: list[int] = []
        self.paths: list[tuple[str, ...]] = []
        self.parents: list[int] = []  # index of the enclosing call's record, -1 for none
        self._open: list[int] = []  # indices of the calls not closed yet, outermost first

    def fold(self) -> None:
        """Turn the log into ranges (also when it grows past its cap: forwards with no step
        boundary and no backward)."""
        log, self.log = self.log, []
        starts, ends, paths, parents, opened = self.starts, self.ends, self.paths, self.parents, self._open
        items: Iterator[Any] = iter(log)
        for number, path in zip(items, items, strict=False):  # the log in pairs
            if path is None:
                if opened:
                    ends[opened.pop()] = number
                continue
            if len(starts) >= _CAP:
                self._drop_oldest(len(starts) // 2)
                starts, ends, paths, parents, opened = self.starts, self.ends, self.paths, self.parents, self._open
            parents.append(opened[-1] if opened else -1)
            opened.append(len(starts))
            starts.append(number)
            ends.append(_OPEN)
            paths.append(path)

    def log_end(self) -> None:
        """Log the end of the innermost module call running (to the list a fold during the call
        left, if it folded)."""
        self.log.append(next_number())
        self.log.append(None)

    def find(self, sequence_nr: int) -> tuple[str, ...] | None:
        """The path of the innermost call that made the node numbered ``sequence_nr``."""
        if self.log:
            self.fold()
        i = bisect_right(self.starts, sequence_nr) - 1
        ends, parents = self.ends, self.parents
        # the calls that hold the number all enclose the latest call started before it
        while i >= 0:
            if sequence_nr < ends[i]:
                return self.paths[i]
            i = parents[i]
        return None

    def clear(self) -> None:
        """Forget the calls, at a step boundary (their graphs are gone), unless one is open."""
        self.fold()
        if not self._open:
            self.starts.clear()
            self.ends.clear()
            self.paths.clear()
            self.parents.clear()

    def _drop_oldest(self, k: int) -> None:
        """Forget the oldest ``k`` calls, except the open ones: nodes made after the drop still
        belong to them. They stay first, where their starts keep the order."""
        keep = [i for i in self._open if i < k] + list(range(k, len(self.starts)))
        renumber = {old: new for new, old in enumerate(keep)}
        self.starts = [self.starts[i] for i in keep]
        self.ends = [self.ends[i] for i in keep]
        self.paths = [self.paths[i] for i in keep]
        self.parents = [renumber.get(self.parents[i], -1) for i in keep]
        self._open = [renumber[i] for i in self._open]


class CallTracking:
    """Light steps' half of :class:`~commdebug.capture.tracker.ModuleTracker`: module calls
    tracked by the ``Module.__call__`` wrapper (``_call``) instead of hooks, and a backward
    collective's module found by its autograd node (``_node_path``). It shares the tracker's
    state (``stack``, ``paths``, ``_known``, ``_ranges``, ``bw_path``...), which the tracker's
    ``__init__`` sets up; the full capture's hooks log module calls here too (``_log_start``)."""

    if TYPE_CHECKING:  # the tracker's state, set by its __init__
        stack: list[str]
        paths: list[tuple[str, ...]]
        bw_path: tuple[str, ...]
        forwards: int
        _names: weakref.WeakKeyDictionary[torch.nn.Module, str]
        _known: dict[int, list[Any]]  # id(module) -> [weakref, fqn, parent path last seen, path under it]
        _param_owners: dict[int, list[Any]]
        _ranges: NodeRanges
        _pinned: int
        _bw_found: tuple[str, ...]
        _new_forward: bool
        _root_path: tuple[str, ...]
        _tasks: list[tuple[int, tuple[str, ...]]]
        _ancestors: dict[str, tuple[str, ...]]
        _on_first_call: Callable[[torch.nn.Module, str, str], None]

        def name_of(self, mod: torch.nn.Module) -> str: ...

    def _node_path(self) -> tuple[str, ...]:
        # light steps: the module call that made the autograd node running now
        found = None
        if not self._pinned:
            node = current_node()
            if node is not None:
                found = self._ranges.find(node._sequence_nr())
                if found is None:
                    # AccumulateGrad (no number in any range): its parameter's module, where
                    # DDP's reducer all-reduces a bucket the parameter's gradient completed
                    owner = self._param_owners.get(id(getattr(node, "variable", None)))
                    found = owner[3] if owner is not None else None
        self._bw_found = found = found or self.bw_path
        return found

    def _know(self, mod: torch.nn.Module) -> list:
        """A light step's first sight of ``mod`` in this context: named and announced as by
        :meth:`_first_call`, without a hook. The entry leaves ``_known`` when the module dies,
        before its id can be reused: ``_known.get(id(mod))`` needs no check."""
        graph = isinstance(mod, torch.fx.GraphModule) and mod not in self._names and in_compiled_code()
        fqn = None if graph else self.name_of(mod)
        key, known = id(mod), self._known
        entry = known[key] = [weakref.ref(mod, lambda _: known.pop(key, None)), fqn, None, None]
        if fqn is not None:
            for param in mod._parameters.values():
                if param is not None:
                    self._param_owners.setdefault(id(param), entry)
            self._on_first_call(mod, fqn, self.stack[-1] if self.stack else GLOBAL)
        return entry

    def _call(self, call: Callable, mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """A module call in a light step (``MODULE_CALL``): ``call(mod, *args, **kwargs)`` with
        the module on the stack, and its autograd nodes' numbers logged when it makes any.

        Where the C++ extension is built, its ``ModuleCalls`` takes the common case (a module
        seen before under the same parent) and this runs for the rest; without it, for every
        module call of a light step. Dynamo answers ``is_dynamo_compiling`` while it traces (the
        flag beside it covers export and AOT tracing): then the call is only run. A module seen
        before is one dict lookup, and the autograd numbers go to a log (:class:`NodeRanges`)."""
        if _dynamo_compiling() or _compiler._is_compiling_flag:
            return call(mod, *args, **kwargs)
        self.forwards += 1
        entry = self._known.get(id(mod)) or self._know(mod)
        fqn = entry[1]
        if fqn is None:
            return call(mod, *args, **kwargs)
        paths = self.paths
        if paths:
            parent = paths[-1]
        elif _graph_task_id() == -1:
            parent = _ROOT
            if self._new_forward:  # the first top-level module since the last backward
                self._new_forward = False
                self._root_path = (GLOBAL, fqn)
                self._tasks.clear()
        else:  # checkpoint recompute without its parents: the ancestors of the real forward
            parent = self._ancestors.get(fqn, _ROOT)
        if entry[2] is parent:
            path = entry[3]
        else:
            path = entry[3] = parent if fqn in parent else (*parent, fqn)
            entry[2] = parent
            self._ancestors[fqn] = parent
        self.stack.append(fqn)
        paths.append(path)
        logged = _grad_enabled()
        if logged:
            self._log_start(path)
        try:
            return call(mod, *args, **kwargs)
        finally:
            if logged:
                self._ranges.log_end()
            self.stack.pop()
            paths.pop()

    def _log_start(self, path: tuple[str, ...]) -> None:
        """Log a module call's start: its path and the autograd number the next node takes (the
        log folded first when full: forwards with no backward)."""
        log = self._ranges.log
        if len(log) >= LOG_CAP:
            self._ranges.fold()
            log = self._ranges.log
        log.append(next_number())
        log.append(path)


def _module_call(original: Callable, patch: ClassPatch) -> Callable:
    users = patch.users  # the trackers in light steps; the list object is kept, so it stays current

    def tracked(mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        if len(users) == 1:
            return users[0]._call(original, mod, args, kwargs)
        return nested_call(list(users), original, mod, args, kwargs)

    # where the extension is built, the common case of CallTracking._call in C and the rest in
    # ``tracked``; else all in ``tracked``. Dynamo traces __call__ (not a C object it cannot
    # read), and reads its first line as true.
    inner = _native.ModuleCalls(original, users, tracked, LOG_CAP) if _native is not None else tracked

    def __call__(mod: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _dynamo_compiling() or _compiler._is_compiling_flag:
            return original(mod, *args, **kwargs)
        try:
            return inner(mod, args, kwargs)
        except BaseException as e:
            _unseen(e)
            raise

    _WRAPPERS.update((tracked.__code__, __call__.__code__))
    return __call__


def _unseen(error: BaseException) -> None:
    """Take the module-call wrapper's frames out of ``error``'s traceback before it is raised on:
    the program's traceback reads as it would without commdebug (docs/ranks.md), torch's own
    ``Module`` frames and all. Every wrapper the error passes does this for its frames (a bare
    ``raise`` then adds none, Python 3.11+), so it costs the length of the traceback per module
    it leaves, and only when one raises."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code in _WRAPPERS:
        tb = tb.tb_next
    error.__traceback__ = tb
    while tb is not None:
        following = tb.tb_next
        while following is not None and following.tb_frame.f_code in _WRAPPERS:
            following = following.tb_next
        tb.tb_next = following
        tb = following


def nested_call(trackers: list, call: Callable, mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """``call(mod, *args, **kwargs)`` inside each tracker's ``_call``, the first outermost."""
    if not trackers:
        return call(mod, *args, **kwargs)
    head, rest = trackers[0], trackers[1:]
    return head._call(lambda m, *a, **k: nested_call(rest, call, m, a, k), mod, args, kwargs)


# the code of the frames a module call runs in commdebug (see _unseen)
_WRAPPERS: set[CodeType] = {CallTracking._call.__code__, nested_call.__code__,
                            *(c for c in nested_call.__code__.co_consts if isinstance(c, CodeType))}

MODULE_CALL = ClassPatch("torch.nn.modules.module", "Module", {"__call__": _module_call})


@contextmanager
def hidden() -> Iterator[None]:
    """``Module.__call__`` as torch has it, for compiled code: Dynamo must see (and guard on)
    what it sees outside a recording, or the program recompiles when a recording starts."""
    original = MODULE_CALL._originals.get("__call__")
    cls = MODULE_CALL.cls()
    if original is None or cls is None or cls.__dict__.get("__call__") is original:
        yield
        return
    wrapped = cls.__dict__["__call__"]
    cls.__call__ = original
    try:
        yield
    finally:
        if MODULE_CALL._originals.get("__call__") is original:
            cls.__call__ = wrapped
