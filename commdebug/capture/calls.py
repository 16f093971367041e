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
  made. The wrapper notes the counter before and after each module call made with gradients
  enabled (:class:`NodeRanges`). A collective issued while autograd runs node N belongs to the
  innermost module call whose range holds N's number: the module whose forward made N. Tensor
  hooks run as part of the node that takes their gradient, so FSDP2's pre-backward unshard
  belongs to the module that made its output's node. Outside any node (an engine callback,
  FSDP2's final callback) the tracker's state decides, as in the full capture.

Limits: the counter is per thread, so a forward run on several threads at once may misplace
backward collectives; ``AccumulateGrad`` nodes have no number in any range (DDP's reducer
all-reduces from their hooks), so those go where the tracker's state says.
"""

from __future__ import annotations

from bisect import bisect_right
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from commdebug.capture.patches import ClassPatch

__all__ = ["MODULE_CALL", "NodeRanges", "hidden", "nested_call"]

_next_sequence_nr = torch._C._autograd._get_sequence_nr
_OPEN = 1 << 64  # above every sequence number, AccumulateGrad's UINT64_MAX included
_CAP = 1 << 16  # records kept; the oldest half goes past this (forwards with no step boundary)


class NodeRanges:
    """The autograd sequence numbers made inside each module call, to find the call behind a node.

    Calls nest (each closes before its caller does), so :meth:`close` ends the innermost open one.

    >>> ranges = NodeRanges()
    >>> ranges.open(("Global", "Model"))  # doctest: +SKIP
    >>> ranges.close(); ranges.find(node._sequence_nr())  # doctest: +SKIP
    """

    __slots__ = ("starts", "ends", "paths", "parents", "_open")

    def __init__(self) -> None:
        self.starts: list[int] = []  # ascending: calls open in order and the counter only grows
        self.ends: list[int] = []
        self.paths: list[tuple[str, ...]] = []
        self.parents: list[int] = []  # index of the enclosing call's record, -1 for none
        self._open: list[int] = []  # indices of the calls not closed yet, outermost first

    def open(self, path: tuple[str, ...]) -> None:
        if len(self.starts) >= _CAP:
            self._drop_oldest(len(self.starts) // 2)
        opened = self._open
        opened.append(len(self.starts))
        self.starts.append(_next_sequence_nr())
        self.ends.append(_OPEN)
        self.paths.append(path)
        self.parents.append(opened[-2] if len(opened) > 1 else -1)

    def close(self) -> None:
        if self._open:
            self.ends[self._open.pop()] = _next_sequence_nr()

    def find(self, sequence_nr: int) -> tuple[str, ...] | None:
        """The path of the innermost call that made the node numbered ``sequence_nr``."""
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


def _module_call(original: Callable, patch: ClassPatch) -> Callable:
    users = patch.users  # the trackers in light steps; the list object is kept, so it stays current

    def __call__(mod: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if len(users) == 1:
            return users[0]._call(original, mod, args, kwargs)
        return nested_call(list(users), original, mod, args, kwargs)

    return __call__


def nested_call(trackers: list, call: Callable, mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """``call(mod, *args, **kwargs)`` inside each tracker's ``_call``, the first outermost."""
    if not trackers:
        return call(mod, *args, **kwargs)
    head, rest = trackers[0], trackers[1:]
    return head._call(lambda m, *a, **k: nested_call(rest, call, m, a, k), mod, args, kwargs)


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
