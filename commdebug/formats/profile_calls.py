"""A torch.profiler trace's collective calls, one event per call whatever records it left.

One call can leave up to three records on the thread that issued it, nested in one another, and
which ones depends on the backend and the torch of the day: a ``c10d::*`` (or functional
collective) dispatcher op, a ``record_param_comms`` CPU op (with the call's arguments since torch
2.1 on NCCL, without any before), and an ``nccl:<op>`` annotation. :func:`group_calls` takes every
such record, groups those that nest on one thread into one call (:class:`CallRecords`), and
:class:`CallReader` reads each call from the richest records it has:

- its op: the outermost dispatcher op's (the call the program made: a barrier that NCCL runs as an
  all_reduce is a barrier), else ``record_param_comms``'s ``"Collective name"``, else the
  annotation's; a name no row of :mod:`commdebug.ops` knows is kept as the op, and said (never
  dropped, never counted twice);
- its group, sequence number, all_to_all splits and peer: ``record_param_comms``'s arguments;
- its sizes: ``record_param_comms``'s element counts, else the dispatcher op's ``Input Dims``
  (recorded with ``record_shapes=True``); a size no record gives is None, never 0.

A ``record_param_comms`` without arguments alone (no annotation or op around or inside it) names
no call: a wait leaves the same. Such records are counted in a note, not as calls.

    >>> calls, lone = group_calls(records, dispatcher_spec)   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from commdebug import ops as _ops
from commdebug.formats.flight_recorder import C10_DTYPES
from commdebug.formats.trace_spans import as_int, as_int_list, span
from commdebug.model.trace import UNKNOWN_GROUP, GroupInfo

__all__ = ["CallRecords", "CallFields", "CallReader", "group_calls", "collective_op", "arg_bytes", "NOT_CALLS"]

# record_param_comms entries that are no collective the program issued
NOT_CALLS = frozenset({"wait", "init", "coalesced", "startCoalescing", "endCoalescing"})
# torch.profiler's "Input type" names -> (dtype, bytes per element)
_INPUT_TYPES = {
    "float": ("float32", 4), "double": ("float64", 8), "c10::Half": ("float16", 2), "c10::BFloat16": ("bfloat16", 2),
    "long int": ("int64", 8), "int": ("int32", 4), "short int": ("int16", 2), "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1), "bool": ("bool", 1), "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16), "c10::Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e5m2": ("float8_e5m2", 1),
}


def collective_op(name: str) -> str | None:
    """A collective's canonical op from a name other tools give it (``_all_gather_base``)."""
    return _ops.canonical_op(name, "profiler") or _ops.canonical_op(name, "flight_recorder")


@dataclass
class CallRecords:
    """The records one call left on its thread (see the module docstring)."""

    tid: Any
    start: float
    end: float
    rpc: dict[str, Any] | None = None  # record_param_comms with a "Collective name"
    annotation: dict[str, Any] | None = None  # nccl:<op>, the CPU's
    op: dict[str, Any] | None = None  # the outermost dispatcher op
    bare: int = 0  # record_param_comms without arguments inside it
    externals: list[Any] = field(default_factory=list)  # every record's External id (GPU kernels name one)

    def add(self, kind: str, e: dict[str, Any]) -> None:
        if kind == "bare":
            self.bare += 1
        elif getattr(self, kind) is None:  # the outermost of a kind: records are met outermost first
            setattr(self, kind, e)
        ext = (e.get("args") or {}).get("External id")
        if ext is not None:
            self.externals.append(ext)


def group_calls(records: list[tuple[str, dict[str, Any]]]) -> tuple[list[CallRecords], int]:
    """``(kind, event)`` records (kinds: ``rpc``, ``bare``, ``annotation``, ``op``) grouped
    into calls, in issue order: each outermost record with the records that start inside it on
    its thread. Also how many ``bare`` records stood alone (no call)."""
    by_thread: dict[Any, list[tuple[float, float, str, dict[str, Any]]]] = defaultdict(list)
    for kind, e in records:
        start, end = span(e)
        by_thread[e.get("tid")].append((start, end, kind, e))
    calls: list[CallRecords] = []
    lone = 0
    for tid, items in by_thread.items():
        items.sort(key=lambda x: (x[0], -x[1]))  # outermost first at equal starts
        current: CallRecords | None = None
        for start, end, kind, e in items:
            if current is None or start > current.end:
                if current is not None:
                    lone += _close(current, calls)
                current = CallRecords(tid, start, end)
            current.add(kind, e)
        if current is not None:
            lone += _close(current, calls)
    calls.sort(key=lambda c: c.start)
    return calls, lone


def _close(call: CallRecords, calls: list[CallRecords]) -> int:
    """Keep a group of records that names a call; 1 for a lone bare record_param_comms."""
    if call.rpc is None and call.annotation is None and call.op is None:
        return call.bare
    calls.append(call)
    return 0


@dataclass
class CallFields:
    """What the records of one call say about it; sizes None where no record gives them."""

    op: str
    spelling: str | None  # the name it was read from, when no row of the registry knows it
    group: GroupInfo
    input_bytes: int | None
    output_bytes: int | None
    dtype: str | None
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    send_splits: tuple[int, ...] | None
    recv_splits: tuple[int, ...] | None
    peer: int | None
    seq: int | None  # ours, from 0
    unsized: str | None = None  # why its sizes are not known, as words after a count of calls


class CallReader:
    """Reads each call's fields (see the module docstring); keeps the groups met and what was
    left unknown, for the reader's notes."""

    def __init__(self, groups: dict[str, GroupInfo], dispatcher_spec: Callable[[str], _ops.CollectiveSpec | None]) -> None:
        self.groups = groups
        self.spec_of = dispatcher_spec
        self.spellings: Counter[str] = Counter()  # names no row of the registry knows -> calls

    def read(self, c: CallRecords) -> CallFields:
        rpc_args = (c.rpc.get("args") or {}) if c.rpc is not None else {}
        op_spec = self.spec_of(str(c.op.get("name", ""))) if c.op is not None else None
        op, spelling = self._op(c, op_spec, rpc_args)
        group = self._group(rpc_args) if c.rpc is not None else self._group({})
        spec = _ops.spec_for_op(op)
        in_bytes = out_bytes = None
        dtype = None
        shapes: tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]] = ((), ())
        unsized = None
        if c.rpc is not None:
            dtype, esize = C10_DTYPES.get(str(rpc_args.get("dtype")), (None, 0))
            nin, nout = as_int(rpc_args.get("In msg nelems")), as_int(rpc_args.get("Out msg nelems"))
            in_bytes = None if nin is None or not esize else nin * esize
            out_bytes = None if nout is None or not esize else nout * esize
        op_args = (c.op.get("args") or {}) if c.op is not None else {}
        dims, types = op_args.get("Input Dims"), op_args.get("Input type")
        if in_bytes is None and op_spec is not None:
            if isinstance(dims, list):
                (in_bytes, in_shapes, dt_in), (out_bytes, out_shapes, dt_out) = (
                    arg_bytes(dims, types, op_spec.inputs), arg_bytes(dims, types, op_spec.outputs))
                dtype = dtype or dt_in or dt_out
                shapes = (in_shapes, out_shapes)
                if op_spec.inputs is None:
                    in_bytes = 0 if out_bytes is not None else None
                if op_spec.outputs is None:
                    out_bytes = 0 if in_bytes is not None else None
                if in_bytes is None:
                    unsized = "whose c10d op's shapes name no element type (a tensor list)"
            else:
                unsized = "whose c10d op was recorded without shapes (record_shapes=False)"
        elif in_bytes is None:
            unsized = ("whose record_param_comms gives no element count or type" if c.rpc is not None
                       else "with no record that carries sizes (no c10d op; record_param_comms without arguments)")
        if spec is not None and spec.size == "zero":  # a barrier moves nothing, whatever the trace says
            in_bytes = out_bytes = 0
            unsized = None
        send = recv = None
        if op == "all_to_all" and in_bytes is not None and out_bytes is not None and group.size:
            send = _splits(as_int_list(rpc_args.get("In split size")), in_bytes, group.size)
            recv = _splits(as_int_list(rpc_args.get("Out split size")), out_bytes, group.size)
        peer = self._peer(op, rpc_args, op_args, op_spec, group) if op in ("send", "recv") else None
        seq = as_int(rpc_args.get("Seq"))
        return CallFields(op, spelling, group, in_bytes, out_bytes, dtype, shapes[0], shapes[1], send, recv, peer,
                          None if seq is None or seq < 1 else seq - 1, unsized)

    def _op(self, c: CallRecords, op_spec: _ops.CollectiveSpec | None, rpc_args: dict[str, Any]) -> tuple[str, str | None]:
        """The call's canonical op and, where no registry row knows any of its names, the name
        it goes by (counted in :attr:`spellings`)."""
        if op_spec is not None:
            return op_spec.op, None
        names = []
        if c.rpc is not None:
            names.append(("record_param_comms " + str(rpc_args.get("Collective name")), str(rpc_args.get("Collective name"))))
        if c.annotation is not None:
            name = str(c.annotation.get("name", ""))
            names.append((name, name.split(":", 1)[1].split(" ", 1)[0]))
        for _, raw in names:
            op = collective_op(raw)
            if op is not None:
                return op, None
        spelling, raw = names[0]
        self.spellings[spelling] += 1
        return raw or spelling, spelling

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

    @staticmethod
    def _peer(op: str, rpc_args: dict[str, Any], op_args: dict[str, Any], op_spec: _ops.CollectiveSpec | None,
              group: GroupInfo) -> int | None:
        """A send's or receive's other side, as a global rank (None within an unknown group)."""
        peer = as_int(rpc_args.get("Dst Rank") if op == "send" else rpc_args.get("Src Rank"))
        if peer is None and op_spec is not None and op_spec.peer is not None:
            concrete = op_args.get("Concrete Inputs")
            if isinstance(concrete, list) and op_spec.peer < len(concrete):
                peer = as_int(concrete[op_spec.peer])
        if peer is not None and group.ranks and 0 <= peer < len(group.ranks):
            return group.ranks[peer]
        return None if group is UNKNOWN_GROUP else peer


def _splits(rows: list[int] | None, total: int, n: int) -> tuple[int, ...] | None:
    """Split sizes in rows of dim 0 as bytes per member; even where none were given."""
    if not rows:
        return _ops.even_splits(total, n)
    count = sum(rows)
    if count <= 0 or total % count or len(rows) != n:
        return None
    row = total // count
    return tuple(r * row for r in rows)


def arg_bytes(dims: list[Any], types: Any, where: int | str | None) -> tuple[int | None, tuple[tuple[int, ...], ...], str | None]:
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
