"""The one registry of collective ops: how to read each op's tensors, group and message size.

Every collective the dispatch mode can see is one row of ``_TABLE``. A row says where the
op's input and output tensors and its process group sit in the call, which tensors make up the
message size S, and the bus-bandwidth factor, both following nccl-tests' conventions
(doc/PERFORMANCE.md there; docs/reading-the-numbers.md here). Adding a way to call an op is
adding one row.

Every canonical op (the ``op`` of those rows) also has one :class:`OpInfo` row in ``_OPS``: the
names other tools give it (torch.distributed / deepspeed.comm functions, Flight Recorder's
profiling names, nccl-tests' test names) and the rule its input and output sizes obey. Readers
of those names ask :func:`canonical_op` / :func:`aliases`; ``commdebug check`` asks
:func:`shape_rule`. Adding an op is adding a row to each table (a test holds them together).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    import torch

__all__ = [
    "CollectiveSpec",
    "table_names",
    "capture_spec",
    "WAIT",
    "WAIT_OPS",
    "OpInfo",
    "ShapeRule",
    "AliasSource",
    "ALIAS_SOURCES",
    "lookup",
    "compat_key_packet",
    "op_for_key",
    "spec_for_op",
    "packet_for_op",
    "canonical_names",
    "op_info",
    "canonical_op",
    "aliases",
    "accepted_names",
    "shape_rule",
    "needs_all",
    "BUSBW_FACTORS",
    "MESSAGE_SIZE",
    "tensor_bytes",
    "pick",
    "split_bytes",
    "even_splits",
]

# Bus-bandwidth factor as a function of the group size n (nccl-tests doc/PERFORMANCE.md).
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "ring": lambda n: (n - 1) / n,  # all_gather, reduce_scatter, all_to_all, gather, scatter
    "one": lambda n: 1.0,  # broadcast, reduce, send, recv
    "zero": lambda n: 0.0,  # barrier moves no payload
}


# Message size S from a call's input and output bytes and group size n, by a spec's ``size``.
# Pure functions of those three numbers: light capture's C++ kernel remembers their answers
# (_native.cpp's message_size).
MESSAGE_SIZE: dict[str, Callable[[int, int, int], int]] = {
    "in": lambda i, o, n: i,
    "out": lambda i, o, n: o,
    "in_x_n": lambda i, o, n: i * n,  # gather: each rank sends its input
    "out_x_n": lambda i, o, n: o * n,  # scatter: each rank receives its output
    "zero": lambda i, o, n: 0,
}


@dataclass(frozen=True)
class CollectiveSpec:
    """How to read one collective op.

    ``inputs``/``outputs``: argument index holding the tensor(s), ``"return"`` for the op's
    result, ``"out"`` for the ``out=`` keyword, ``None`` when there is none.
    ``group``: argument index of the group name (functional ops) or ProcessGroup (c10d ops);
    ``"legacy"`` for the old functional ops that pass ``(tag, ranks, group_size)``; ``None`` for
    an eager c10d op not in the table (its second argument, if it has one).
    ``size``: which bytes are the message size S: ``"in"``, ``"out"``, ``"in_x_n"`` (gather:
    each rank sends its input, S is the whole gathered buffer), ``"out_x_n"`` (scatter), ``"zero"``.
    ``peer``: for point-to-point ops, the argument index of the other side's rank in the group.
    ``returns_done``: the call returns with the collective finished on the host's side (no Work,
    no ``wait_tensor``), so nothing is left to wait for (async TP's fused matmul collectives).
    ``splits``: how an all_to_all splits its buffers among the group's members (see
    :func:`split_bytes`): ``(output, input)``, the argument indices of its split sizes in rows
    of dim 0 (empty or None: even); ``"tensors"``, one tensor per member; ``"even"``.
    """

    op: str  # canonical name: all_reduce, all_gather, ...
    compat_key: str  # the reference CommDebugMode's count key, e.g. "c10d_functional.all_reduce"
    inputs: int | str | None
    outputs: int | str | None
    group: int | Literal["legacy"] | None
    size: str
    factor: str
    peer: int | None = None
    returns_done: bool = False
    splits: tuple[int, int] | Literal["tensors", "even"] | None = None
    # eager c10d ops: the argument index of ``async_op`` (set by :func:`lookup` from the schema)
    async_flag: int | None = None
    # point-to-point: only two ranks of the group take part, so no collective sequence (a
    # field, not a property: the capture path reads it for every collective)
    is_p2p: bool = field(init=False)
    # every tensor the record reads is an argument (eager c10d ops): the call can be recorded
    # before it runs, so a process that dies inside it (a native abort) keeps it
    known_before: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_p2p", self.op in ("send", "recv", "batch_p2p"))
        object.__setattr__(self, "known_before", "return" not in (self.inputs, self.outputs))

    def busbw_factor(self, group_size: int) -> float:
        return BUSBW_FACTORS[self.factor](max(group_size, 1))


def _row(op: str, compat: str, inputs: int | str | None, outputs: int | str | None, group: int | Literal["legacy"],
         size: str, factor: str, peer: int | None = None, returns_done: bool = False,
         splits: tuple[int, int] | Literal["tensors", "even"] | None = None) -> CollectiveSpec:
    return CollectiveSpec(op, compat, inputs, outputs, group, size, factor, peer, returns_done, splits)


_LEG = "c10d_functional."  # legacy functional namespace: the reference's count keys

# qualified packet name -> spec. Native functional ops count under the legacy key, as the
# reference does, so `get_comm_counts()[torch.ops.c10d_functional.all_reduce]` keeps working.
_TABLE: dict[str, CollectiveSpec] = {
    # native functional collectives (torch.distributed._functional_collectives)
    "_c10d_functional.all_reduce": _row("all_reduce", _LEG + "all_reduce", 0, "return", 2, "in", "all_reduce"),
    "_c10d_functional.all_reduce_": _row("all_reduce", _LEG + "all_reduce", 0, 0, 2, "in", "all_reduce"),
    "_c10d_functional.all_reduce_coalesced": _row("all_reduce", _LEG + "all_reduce_coalesced", 0, "return", 2, "in", "all_reduce"),
    "_c10d_functional.all_reduce_coalesced_": _row("all_reduce", _LEG + "all_reduce_coalesced", 0, 0, 2, "in", "all_reduce"),
    "_c10d_functional.all_gather_into_tensor": _row("all_gather", _LEG + "all_gather_into_tensor", 0, "return", 2, "out", "ring"),
    "_c10d_functional.all_gather_into_tensor_out": _row("all_gather", _LEG + "all_gather_into_tensor", 0, "out", 2, "out", "ring"),
    "_c10d_functional.all_gather_into_tensor_coalesced": _row("all_gather", _LEG + "all_gather_into_tensor_coalesced", 0, "return", 2, "out", "ring"),
    "_c10d_functional.reduce_scatter_tensor": _row("reduce_scatter", _LEG + "reduce_scatter_tensor", 0, "return", 3, "in", "ring"),
    "_c10d_functional.reduce_scatter_tensor_out": _row("reduce_scatter", _LEG + "reduce_scatter_tensor", 0, "out", 3, "in", "ring"),
    "_c10d_functional.reduce_scatter_tensor_coalesced": _row("reduce_scatter", _LEG + "reduce_scatter_tensor_coalesced", 0, "return", 3, "in", "ring"),
    "_c10d_functional.all_to_all_single": _row("all_to_all", _LEG + "all_to_all_single", 0, "return", 3, "in", "ring", splits=(1, 2)),
    "_c10d_functional.broadcast": _row("broadcast", _LEG + "broadcast", 0, "return", 2, "in", "one"),
    "_c10d_functional.broadcast_": _row("broadcast", _LEG + "broadcast", 0, 0, 2, "in", "one"),
    "_c10d_functional.isend": _row("send", _LEG + "isend", 0, None, 3, "in", "one", peer=1),
    "_c10d_functional.irecv": _row("recv", _LEG + "irecv", None, 0, 3, "out", "one", peer=1),
    "_c10d_functional.batch_p2p_ops": _row("batch_p2p", _LEG + "batch_p2p_ops", 3, None, 4, "in", "one"),
    # autograd-aware functional collectives
    "_c10d_functional_autograd.all_to_all_single": _row("all_to_all", _LEG + "all_to_all_single", 0, "return", 3, "in", "ring", splits=(1, 2)),
    "_c10d_functional_autograd.all_gather_into_tensor": _row("all_gather", _LEG + "all_gather_into_tensor", 0, "return", 2, "out", "ring"),
    "_c10d_functional_autograd.reduce_scatter_tensor": _row("reduce_scatter", _LEG + "reduce_scatter_tensor", 0, "return", 3, "in", "ring"),
    # legacy functional collectives: (..., tag, ranks, group_size)
    "c10d_functional.all_reduce": _row("all_reduce", _LEG + "all_reduce", 0, "return", "legacy", "in", "all_reduce"),
    "c10d_functional.all_reduce_coalesced": _row("all_reduce", _LEG + "all_reduce_coalesced", 0, "return", "legacy", "in", "all_reduce"),
    "c10d_functional.all_gather_into_tensor": _row("all_gather", _LEG + "all_gather_into_tensor", 0, "return", "legacy", "out", "ring"),
    "c10d_functional.all_gather_into_tensor_coalesced": _row("all_gather", _LEG + "all_gather_into_tensor_coalesced", 0, "return", "legacy", "out", "ring"),
    "c10d_functional.reduce_scatter_tensor": _row("reduce_scatter", _LEG + "reduce_scatter_tensor", 0, "return", "legacy", "in", "ring"),
    "c10d_functional.reduce_scatter_tensor_coalesced": _row("reduce_scatter", _LEG + "reduce_scatter_tensor_coalesced", 0, "return", "legacy", "in", "ring"),
    "c10d_functional.all_to_all_single": _row("all_to_all", _LEG + "all_to_all_single", 0, "return", "legacy", "in", "ring", splits=(1, 2)),
    "c10d_functional.broadcast": _row("broadcast", _LEG + "broadcast", 0, "return", "legacy", "in", "one"),
    "c10d_functional.isend": _row("send", _LEG + "isend", 0, None, 3, "in", "one", peer=1),
    "c10d_functional.irecv": _row("recv", _LEG + "irecv", None, 0, 3, "out", "one", peer=1),
    "c10d_functional.batch_p2p_ops": _row("batch_p2p", _LEG + "batch_p2p_ops", 3, None, 4, "in", "one"),
    # async tensor parallel (symmetric memory, CUDA): a matmul fused with the collective that
    # feeds it (all-gather: S is the gathered A) or consumes it (reduce-scatter: S is the whole
    # product, n times the returned shard); they return finished on the host's side
    "symm_mem.fused_all_gather_matmul": _row("all_gather", "symm_mem.fused_all_gather_matmul", 0, None, 3, "in_x_n", "ring", returns_done=True),
    "symm_mem.fused_all_gather_scaled_matmul": _row("all_gather", "symm_mem.fused_all_gather_scaled_matmul", 0, None, 5, "in_x_n", "ring", returns_done=True),
    "symm_mem.fused_matmul_reduce_scatter": _row("reduce_scatter", "symm_mem.fused_matmul_reduce_scatter", None, "return", 4, "out_x_n", "ring", returns_done=True),
    "symm_mem.fused_scaled_matmul_reduce_scatter": _row("reduce_scatter", "symm_mem.fused_scaled_matmul_reduce_scatter", None, "return", 7, "out_x_n", "ring", returns_done=True),
    # DTensor's fused shard-dim all-to-all
    "_dtensor.shard_dim_alltoall": _row("all_to_all", "_dtensor.shard_dim_alltoall", 0, "return", 3, "in", "ring", splits="even"),
    # eager c10d ops (torch.distributed.all_reduce & co., send/recv, barrier)
    "c10d.allreduce_": _row("all_reduce", "c10d.allreduce_", 0, 0, 1, "in", "all_reduce"),
    "c10d.allreduce_coalesced_": _row("all_reduce", "c10d.allreduce_coalesced_", 0, 0, 1, "in", "all_reduce"),
    "c10d.broadcast_": _row("broadcast", "c10d.broadcast_", 0, 0, 1, "in", "one"),
    "c10d.reduce_": _row("reduce", "c10d.reduce_", 0, 0, 1, "in", "one"),
    "c10d.allgather_": _row("all_gather", "c10d.allgather_", 1, 0, 2, "out", "ring"),
    "c10d._allgather_base_": _row("all_gather", "c10d._allgather_base_", 1, 0, 2, "out", "ring"),
    "c10d.allgather_coalesced_": _row("all_gather", "c10d.allgather_coalesced_", 1, 0, 2, "out", "ring"),
    "c10d.allgather_into_tensor_coalesced_": _row("all_gather", "c10d.allgather_into_tensor_coalesced_", 1, 0, 2, "out", "ring"),
    "c10d.reduce_scatter_": _row("reduce_scatter", "c10d.reduce_scatter_", 1, 0, 2, "in", "ring"),
    "c10d._reduce_scatter_base_": _row("reduce_scatter", "c10d._reduce_scatter_base_", 1, 0, 2, "in", "ring"),
    "c10d.reduce_scatter_tensor_coalesced_": _row("reduce_scatter", "c10d.reduce_scatter_tensor_coalesced_", 1, 0, 2, "in", "ring"),
    "c10d.alltoall_": _row("all_to_all", "c10d.alltoall_", 1, 0, 2, "in", "ring", splits="tensors"),
    "c10d.alltoall_base_": _row("all_to_all", "c10d.alltoall_base_", 1, 0, 2, "in", "ring", splits=(3, 4)),
    "c10d.gather_": _row("gather", "c10d.gather_", 1, 0, 2, "in_x_n", "ring"),
    "c10d.scatter_": _row("scatter", "c10d.scatter_", 1, 0, 2, "out_x_n", "ring"),
    "c10d.send": _row("send", "c10d.send", 0, None, 1, "in", "one", peer=2),
    "c10d.recv_": _row("recv", "c10d.recv_", None, 0, 1, "out", "one", peer=2),
    "c10d.recv_any_source_": _row("recv", "c10d.recv_any_source_", None, 0, 1, "out", "one"),
    "c10d.barrier": _row("barrier", "c10d.barrier", None, None, 1, "zero", "zero"),
    "c10d.monitored_barrier_": _row("barrier", "c10d.monitored_barrier_", None, None, 1, "zero", "zero"),
}

# Eager c10d ops not in the table are still counted, under their own name, with no bytes
# (lookup gives them a spec with no tensors and no group index).
_NOT_COLLECTIVE_C10D = {"c10d.check_for_nan"}


_by_packet: dict[Any, CollectiveSpec | None] = {}


def table_names() -> tuple[str, ...]:
    """Every dispatcher op of the registry, as ``"namespace.name"`` (``"c10d.allreduce_"``)."""
    return tuple(_TABLE)


# A functional collective finishes when its output is waited for: capture watches these ops too.
WAIT_OPS = ("_c10d_functional.wait_tensor", "c10d_functional.wait_tensor")
WAIT = "wait"  # what capture_spec returns for them


def capture_spec(packet: Any) -> CollectiveSpec | str | None:
    """What capture does with an op: its collective spec, :data:`WAIT` for a functional
    collective's wait, or None (an op capture only counts)."""
    return WAIT if str(packet) in WAIT_OPS else lookup(packet)


def lookup(packet: Any) -> CollectiveSpec | None:
    """The spec of an op overload packet, or ``None`` when it is not a collective.

    Memoised per packet so the dispatch mode pays one dict lookup per op.

    >>> lookup(torch.ops._c10d_functional.all_reduce).op
    'all_reduce'
    """
    try:
        return _by_packet[packet]
    except KeyError:
        pass
    name = str(packet)  # "namespace.name"
    spec = _TABLE.get(name)
    if spec is None and name.startswith("c10d.") and name not in _NOT_COLLECTIVE_C10D:
        spec = CollectiveSpec(op=name.split(".", 1)[1].rstrip("_"), compat_key=name, inputs=None, outputs=None,
                              group=None, size="zero", factor="zero")
    if spec is not None and (flag := _async_flag(packet)) is not None:
        spec = replace(spec, async_flag=flag)
    _by_packet[packet] = spec
    return spec


def _async_flag(packet: Any) -> int | None:
    try:  # the schema torch keeps; a test's stand-in packet has none
        return next((i for i, a in enumerate(packet.default._schema.arguments) if a.name == "async_op"), None)
    except (AttributeError, RuntimeError):
        return None


_packet_cache: dict[str, Any] = {}


def compat_key_packet(key: str) -> Any:
    """The op packet a reference-style count key names (``"c10d_functional.all_reduce"`` ->
    ``torch.ops.c10d_functional.all_reduce``); the key string itself when torch has no such op."""
    try:
        return _packet_cache[key]
    except KeyError:
        pass
    import torch  # a live recording (or the compat API) asks: torch is loaded already

    ns, _, name = key.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        packet = key
    _packet_cache[key] = packet
    return packet


class _DtypeNames(dict):
    """dtype -> its name without "torch.", worked out on first use: ``_DTYPE_NAMES[dtype]`` is
    one lookup in C for every tensor of every collective."""

    def __missing__(self, dtype: Any) -> str:
        name = self[dtype] = str(dtype)[6:]  # "torch.float32" -> "float32"
        return name


_DTYPE_NAMES = _DtypeNames()


# torch.Tensor, looked up on the first tensor_bytes call: the registry's data is read by offline
# verbs that must not import torch, while capture calls tensor_bytes for every collective
_tensor_type: type[torch.Tensor] | None = None


def _torch_tensor() -> type[torch.Tensor]:
    global _tensor_type
    import torch

    _tensor_type = torch.Tensor
    return _tensor_type


def tensor_bytes(value: Any) -> tuple[int, tuple[tuple[int, ...], ...], str | None]:
    """Total bytes, shapes and dtype of a tensor or (nested) list of tensors."""
    Tensor = _tensor_type or _torch_tensor()
    if isinstance(value, Tensor):  # the common cases first, without the walk
        return value.nbytes, (tuple(value.shape),), _DTYPE_NAMES[value.dtype]
    if type(value) is list or type(value) is tuple:  # eager c10d ops: a flat list of tensors
        total = 0
        flat: list[tuple[int, ...]] = []
        for v in value:
            if not isinstance(v, Tensor):
                break
            total += v.nbytes
            flat.append(tuple(v.shape))
        else:
            return total, tuple(flat), _DTYPE_NAMES[value[0].dtype] if value else None
    total = 0
    shapes: list[tuple[int, ...]] = []
    dtype = None
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, Tensor):
            total += v.nbytes
            shapes.append(tuple(v.shape))
            if dtype is None:
                dtype = _DTYPE_NAMES[v.dtype]
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
    return total, tuple(shapes), dtype


def pick(where: int | str | None, args: Sequence[Any], kwargs: dict, result: Any) -> Any:
    """The value a spec's ``inputs``/``outputs`` field points at."""
    if where is None:
        return None
    if where == "return":
        return result
    if where == "out":
        return kwargs.get("out")
    if isinstance(where, int) and where < len(args):
        return args[where]
    return None


_EVEN: dict[tuple[int, int], tuple[int, ...]] = {}


def even_splits(total: int, n: int) -> tuple[int, ...]:
    """``total`` bytes split evenly among ``n`` members (one shared tuple per (total, n): a
    thousand-member group's even splits cost one tuple, not one per call).

    >>> even_splits(1024, 4)
    (256, 256, 256, 256)
    """
    key = (total, n)
    found = _EVEN.get(key)
    if found is None:
        if len(_EVEN) > 4096:
            _EVEN.clear()
        found = _EVEN[key] = (total // n,) * n
    return found


def _rows(sizes: Any, tensor: Any) -> tuple[int, ...] | None:
    """Split sizes given in rows of dim 0 of ``tensor``, as bytes; None when none were given."""
    if not sizes:
        return None
    row = tensor.element_size()
    for d in tensor.shape[1:]:
        row *= d
    return tuple(int(s) * row for s in sizes)


def split_bytes(spec: CollectiveSpec, args: Sequence[Any], inputs: Any, outputs: Any, in_bytes: int, out_bytes: int,
                n: int) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """``(send, recv)``: the bytes an all_to_all sends to and receives from each member of its
    group of ``n``, in group order; ``(None, None)`` for an op with no splits (``spec.splits``).
    Split sizes count rows of dim 0; where none were given, the buffers split evenly. The
    output's rows are the input's size (torch requires it), so a call that raised (no output)
    still has both where its receive sizes were given; without them, and without an output, what
    it would have received is not known (None).

    >>> split_bytes(_TABLE["c10d.alltoall_base_"], [out, inp, pg, [1, 3], [2, 2]], inp, out, 16, 16, 2)  # doctest: +SKIP
    ((8, 8), (4, 12))
    """
    how = spec.splits
    if how is None or n <= 0:
        return None, None
    if how == "tensors":
        def each(tensors: Any) -> tuple[int, ...] | None:
            if not isinstance(tensors, (list, tuple)) or len(tensors) != n:
                return None
            return tuple(t.numel() * t.element_size() for t in tensors)
        return each(inputs), each(outputs)
    send = recv = None
    if how != "even" and isinstance(inputs, _tensor_type or _torch_tensor()) and inputs.dim() > 0:
        recv_at, send_at = how
        recv = _rows(args[recv_at] if recv_at < len(args) else None, inputs)
        send = _rows(args[send_at] if send_at < len(args) else None, inputs)
    if send is None:
        send = even_splits(in_bytes, n)
    if recv is None and (outputs is not None or how == "even"):
        recv = even_splits(out_bytes if outputs is not None else in_bytes, n)
    return send, recv


def packet_for_op(op: str) -> str | None:
    """The qualified packet name of a canonical op's first registry row, ``None`` for no such op.

    >>> packet_for_op("all_gather")
    '_c10d_functional.all_gather_into_tensor'
    """
    for name, spec in _TABLE.items():
        if spec.op == op:
            return name
    return None


def spec_for_op(op: str) -> CollectiveSpec | None:
    """A registry row of a canonical op (its S rule and busbw factor are the op's), for
    records that name the op only (Flight Recorder's ``gloo:all_reduce``)."""
    packet = packet_for_op(op)
    return None if packet is None else _TABLE[packet]


def canonical_names() -> frozenset[str]:
    """Every canonical op name in the registry: all_reduce, all_gather, send, ..."""
    return frozenset(spec.op for spec in _TABLE.values())


def op_for_key(key: str) -> str:
    """Canonical op name of a reference count key (``"c10d_functional.all_reduce"`` -> ``"all_reduce"``)."""
    for spec in _TABLE.values():
        if spec.compat_key == key:
            return spec.op
    return key.rsplit(".", 1)[-1].rstrip("_")


# ---- per-op facts: other tools' names for each op, and its size rule ---------------------


@dataclass(frozen=True)
class ShapeRule:
    """How one op's input and output sizes must agree, for a group of n ranks.

    ``whole``: the side that is n times the other on every call (all_gather's output holds every
    member's input; reduce_scatter's input holds every member's output). ``balanced``: only the
    group's totals must agree, what its members send summed is what they receive (all_to_all's
    splits may be uneven). ``whole_may_be_list``: the whole side may be a list of tensors
    (``dist.all_gather``), which Flight Recorder records one entry per tensor, so a call's sizes
    there are not the op's.

    >>> shape_rule("all_gather").mismatch(input_bytes=4, output_bytes=24, group_size=8)
    (24, 4)
    """

    whole: Literal["input", "output"] | None = None
    balanced: bool = False
    whole_may_be_list: bool = False

    @property
    def part(self) -> Literal["input", "output"]:
        """The side of which ``whole`` holds n."""
        return "input" if self.whole == "output" else "output"

    def mismatch(self, input_bytes: int, output_bytes: int, group_size: int) -> tuple[int, int] | None:
        """``(whole bytes, part bytes)`` when one call breaks the per-call rule, else ``None``."""
        if self.whole is None:
            return None
        whole, part = (output_bytes, input_bytes) if self.whole == "output" else (input_bytes, output_bytes)
        return None if whole == group_size * part else (whole, part)


@dataclass(frozen=True)
class OpInfo:
    """One canonical op: the names other tools give it, and the rule its sizes obey.

    ``torch``: torch.distributed / deepspeed.comm function names besides ``op`` itself (the
    ``ops=[...]`` option takes them); ``flight_recorder``: Flight Recorder's profiling names, the
    part after ``backend:`` (all of them, ``op`` included where it writes that; torch.profiler's
    ``nccl:<name>`` annotations and ``gloo:<name>`` spans use the same); ``profiler``: the
    ``"Collective name"`` torch.profiler writes on ``record_param_comms`` where it differs from
    Flight Recorder's; ``nccl_tests``: nccl-tests' test names, the ``<name>_perf`` binaries.
    ``shape``: ``None`` where the sizes need not agree in any way ``commdebug check`` can see.
    ``needs_all``: no member's call can finish before every member of the group issued it (every
    member's data goes into every member's result): one member's finished call proves the others
    issued it. Not so for a rooted op (a broadcast root may finish before the others arrive) or
    point-to-point.
    """

    op: str
    torch: tuple[str, ...] = ()
    flight_recorder: tuple[str, ...] = ()
    nccl_tests: tuple[str, ...] = ()
    shape: ShapeRule | None = None
    profiler: tuple[str, ...] = ()
    needs_all: bool = False


AliasSource = Literal["torch", "flight_recorder", "nccl_tests", "profiler"]
ALIAS_SOURCES: tuple[AliasSource, ...] = get_args(AliasSource)

# Row order is the order nccl-tests names are tried in (calibrate matches them within file
# names), so keep the ops of the older table first.
_OPS: dict[str, OpInfo] = {info.op: info for info in (
    OpInfo("all_reduce", torch=("all_reduce_coalesced", "inference_all_reduce"),
           flight_recorder=("allreduce", "all_reduce", "allreduce_coalesced", "all_reduce_coalesced", "sparse_all_reduce"),
           nccl_tests=("all_reduce",),
           profiler=("allreduce", "allreduce_coalesced"), needs_all=True),
    OpInfo("all_gather", torch=("all_gather_into_tensor", "all_gather_base", "allgather_fn", "all_gather_coalesced"),
           flight_recorder=("allgather", "all_gather", "_allgather_base", "_all_gather_base", "allgather_into_tensor_coalesced",
                            "all_gather_into_tensor_coalesced"),
           nccl_tests=("all_gather",), shape=ShapeRule(whole="output", whole_may_be_list=True),
           profiler=("allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced"), needs_all=True),
    OpInfo("reduce_scatter", torch=("reduce_scatter_tensor", "reduce_scatter_base", "reduce_scatter_fn"),
           flight_recorder=("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"),
           nccl_tests=("reduce_scatter",), shape=ShapeRule(whole="input"),
           profiler=("_reduce_scatter_base", "reduce_scatter_tensor_coalesced"), needs_all=True),
    OpInfo("all_to_all", torch=("all_to_all_single",), flight_recorder=("all_to_all", "alltoall", "alltoall_base"),
           nccl_tests=("alltoall",), shape=ShapeRule(balanced=True), profiler=("alltoall", "alltoall_base"), needs_all=True),
    OpInfo("broadcast", flight_recorder=("broadcast", "_broadcast_oop"), nccl_tests=("broadcast",), profiler=("_broadcast_oop",)),
    OpInfo("reduce", flight_recorder=("reduce", "_reduce_oop"), nccl_tests=("reduce",), profiler=("_reduce_oop",)),
    OpInfo("gather", flight_recorder=("gather",)),
    OpInfo("scatter", flight_recorder=("scatter",)),
    # sendrecv_perf times a send and a receive at once; S is what each rank sends
    OpInfo("send", torch=("isend",), flight_recorder=("send",), nccl_tests=("sendrecv",)),
    OpInfo("recv", torch=("irecv",), flight_recorder=("recv", "recvAnySource")),
    OpInfo("batch_p2p"),
    OpInfo("barrier", torch=("monitored_barrier",), flight_recorder=("barrier",), needs_all=True),
)}


def _alias_map(source: AliasSource) -> dict[str, str]:
    out: dict[str, str] = {}
    for info in _OPS.values():
        for name in getattr(info, source):
            if out.setdefault(name, info.op) != info.op:  # a name a reader could not resolve
                raise ValueError(f"{source} name {name!r} is listed for both {out[name]} and {info.op}")
    return out


_ALIASES: dict[str, Mapping[str, str]] = {source: _alias_map(source) for source in ALIAS_SOURCES}


def op_info(op: str) -> OpInfo | None:
    """The per-op row of a canonical op, ``None`` for no such op."""
    return _OPS.get(op)


def aliases(source: AliasSource) -> Mapping[str, str]:
    """Every name ``source`` gives an op, as the rows list them, -> the canonical op; in row order.

    >>> aliases("nccl_tests")["alltoall"]
    'all_to_all'
    """
    try:
        return _ALIASES[source]
    except KeyError:
        raise ValueError(f"unknown alias source {source!r} (known: {', '.join(ALIAS_SOURCES)})") from None


def canonical_op(name: str, source: AliasSource | None = None) -> str | None:
    """``name`` as a canonical op: itself when it is one, else the op ``source`` means by it;
    ``None`` when it is neither.

    >>> canonical_op("_allgather_base", source="flight_recorder")
    'all_gather'
    >>> canonical_op("allreduce", source="torch") is None  # Flight Recorder's name, not torch's
    True
    """
    if name in _OPS:
        return name
    return None if source is None else aliases(source).get(name)


def accepted_names(source: AliasSource) -> frozenset[str]:
    """Every name :func:`canonical_op` resolves for ``source``: the canonical ones and its aliases."""
    return frozenset(_OPS) | frozenset(aliases(source))


def needs_all(op: str) -> bool:
    """Whether a finished call of ``op`` proves every member of its group issued it (see
    :class:`OpInfo`).

    >>> needs_all("all_reduce"), needs_all("broadcast")
    (True, False)
    """
    info = _OPS.get(op)
    return info is not None and info.needs_all


def shape_rule(op: str) -> ShapeRule | None:
    """The size rule of a canonical op, ``None`` where it has none.

    >>> shape_rule("reduce_scatter").whole
    'input'
    """
    info = _OPS.get(op)
    return None if info is None else info.shape
