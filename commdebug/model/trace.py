"""The trace model: what a run did, independent of how it was captured or will be shown.

A :class:`Trace` is filled live by :class:`commdebug.CommDebugMode` or built by
:func:`commdebug.load` from a JSON dump; every renderer takes a ``Trace`` and nothing else, so a
dump from another machine renders exactly like a live run.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "GLOBAL",
    "PHASES",
    "FORWARD",
    "BACKWARD",
    "CHECKPOINT",
    "OPTIMIZER",
    "GroupInfo",
    "TRIVIAL_OPS",
    "ModuleInfo",
    "OpRow",
    "CollectiveStat",
    "CollectiveEvent",
    "Trace",
    "ops_at_noise",
    "check_noise_level",
    "known_bytes",
    "UNKNOWN_GROUP",
    "UNKNOWN_LABEL",
]

GLOBAL = "Global"
# Where a collective ran. Exclusive: a recompute under activation checkpointing is "checkpoint",
# not "backward"; ``optimizer.step()`` is "optimizer" (the reference counts it as forward).
FORWARD, BACKWARD, CHECKPOINT, OPTIMIZER = "forward", "backward", "checkpoint", "optimizer"
PHASES = (FORWARD, BACKWARD, CHECKPOINT, OPTIMIZER)

# Ops the reference hides below noise level 3.
TRIVIAL_OPS = frozenset(
    {
        "aten.detach.default",
        "aten.t.default",
        "aten.view.default",
        "aten._to_copy.default",
        "aten.as_strided.default",
        "aten.transpose.int",
    }
)


class GroupInfo(NamedTuple):
    """A process group: its name (torch's ``group_name``), description (``group_desc``, e.g.
    DeviceMesh's ``mesh_tp``), size and global ranks (``None`` when unknown)."""

    name: str
    desc: str
    size: int
    ranks: tuple[int, ...] | None

    @property
    def label(self) -> str:
        """How reports name the group: ``mesh_tp[4]``, ``default_pg[8]``, ``group 7[2]``."""
        if self.name == "?":
            return UNKNOWN_LABEL
        base = self.desc if self.desc and self.desc != "undefined" else f"group {self.name}"
        return f"{base}[{self.size}]" if self.size else base

    def to_dict(self) -> dict[str, Any]:
        return {"desc": self.desc, "size": self.size, "ranks": None if self.ranks is None else list(self.ranks)}

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> GroupInfo:
        ranks = d.get("ranks")
        return cls(str(name), str(d.get("desc") or ""), int(d.get("size") or 0), None if ranks is None else tuple(int(r) for r in ranks))


UNKNOWN_GROUP = GroupInfo("?", "", 0, None)
# how reports name a group the data does not name (a trace's calls without group arguments): a
# word, never "?", which stands for a value not known
UNKNOWN_LABEL = "unknown"


@dataclass
class ModuleInfo:
    """One node of the module tree. ``parameters`` maps a DTensor parameter to its placements."""

    fqn: str
    parent: str | None
    module_type: str = ""
    parameters: dict[str, str] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OpRow:
    """A dispatched op signature and how often it ran, as text (the reference's op row)."""

    name: str
    input_shape: tuple[str, ...]
    input_sharding: tuple[str, ...]
    device_mesh: str
    count: int

    @property
    def is_dtensor(self) -> bool:
        return bool(self.input_sharding)

    @property
    def is_trivial(self) -> bool:
        return self.name in TRIVIAL_OPS


@dataclass(frozen=True)
class CollectiveStat:
    """Collectives of one kind on one group, aggregated for a module and phase."""

    key: str  # reference count key, e.g. "c10d_functional.all_reduce"
    op: str  # canonical name, e.g. "all_reduce"
    group: GroupInfo
    count: int
    bytes: int | None  # sum of the known message sizes S; None when no call's size is known
    unknown: int = 0  # calls whose size is not known (a trace without shapes): not in `bytes`


class CollectiveEvent(NamedTuple):
    """One collective call (immutable; a tuple, cheap to build on the capture path).

    Field meanings: docs/json-format.md."""

    index: int  # type: ignore[assignment]  # shadows tuple.index(), which nothing calls: the dump's name
    op: str
    key: str
    aten_op: str
    step: int
    phase: str
    module: str
    group: GroupInfo
    seq: int | None  # per-group collective sequence number; None for point-to-point ops
    dtype: str | None
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    # None: not known (a torch.profiler trace recorded without shapes); never counted as 0
    input_bytes: int | None
    output_bytes: int | None
    size_bytes: int | None
    busbw_factor: float | None  # None: the group's size, which it depends on, is not known
    dtensor_op: str | None = None
    placements: str | None = None
    mesh: str | None = None
    source: str | None = None
    latency_s: float | None = None
    peer: int | None = None  # send/recv: the other side, as a global rank
    p2p_seq: int | None = None  # send/recv: n-th send to (or recv from) this peer on this group
    microbatch: int | None = None  # pipelining: the schedule's microbatch index
    start_s: float | None = None  # seconds from the context's start to the call (host clock)
    in_flight: bool = False  # not finished when the dump was written (a hang)
    error: str | None = None  # the collective raised (issuing it or waiting for it): the error
    unit: str | None = None  # FSDP2: the module whose parameters this gathers / gradients it reduces
    compiled: bool = False  # issued by torch.compile'd code (Inductor's, an FX graph's, AOTAutograd's)
    # all_to_all: bytes sent to / received from each member of the group, in group order (the
    # group's ranks); None for ops that have none, and in dumps written before they were kept
    send_splits: tuple[int, ...] | None = None
    recv_splits: tuple[int, ...] | None = None

    @property
    def group_name(self) -> str:
        return self.group.name

    @property
    def group_size(self) -> int:
        return self.group.size

    @property
    def group_ranks(self) -> tuple[int, ...] | None:
        return self.group.ranks

    @property
    def algbw_gbps(self) -> float | None:
        """Algorithm bandwidth S / t in GB/s (1e9 bytes/s), when timed and its size is known."""
        if not self.latency_s or self.size_bytes is None:
            return None
        return self.size_bytes / self.latency_s / 1e9

    @property
    def busbw_gbps(self) -> float | None:
        """Bus bandwidth, when its algbw and its op's factor for its group's size are known."""
        algbw = self.algbw_gbps
        return None if algbw is None or self.busbw_factor is None else algbw * self.busbw_factor

    def to_dict(self) -> dict[str, Any]:
        """The event as plain data, the group by name (the dump stores events by column, see
        :func:`commdebug.model.events.encode_events`)."""
        d = self._asdict()
        d["group"] = self.group.name
        d["input_shapes"] = [list(s) for s in self.input_shapes]
        d["output_shapes"] = [list(s) for s in self.output_shapes]
        for name in ("send_splits", "recv_splits"):
            if d[name] is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], groups: dict[str, GroupInfo]) -> CollectiveEvent:
        """An event from :meth:`to_dict`'s form, or from schema 1's (the group inline)."""
        group = d.get("group")
        if isinstance(group, dict):  # schema 1: the group inline
            info = GroupInfo.from_dict(str(group.get("name", "?")), group)
        else:
            info = groups.get(str(group), UNKNOWN_GROUP)
        seq = d.get("seq")
        return cls(
            index=int(d["index"]),
            op=str(d["op"]),
            key=str(d.get("key", d["op"])),
            aten_op=str(d.get("aten_op", "")),
            step=int(d.get("step", 0)),
            phase=str(d.get("phase", "forward")),
            module=str(d.get("module", GLOBAL)),
            group=info,
            seq=None if seq is None else int(seq),
            dtype=d.get("dtype"),
            input_shapes=tuple(tuple(s) for s in d.get("input_shapes", ())),
            output_shapes=tuple(tuple(s) for s in d.get("output_shapes", ())),
            input_bytes=_maybe_int(d.get("input_bytes", 0)),
            output_bytes=_maybe_int(d.get("output_bytes", 0)),
            size_bytes=_maybe_int(d.get("size_bytes", 0)),
            busbw_factor=None if d.get("busbw_factor", 0.0) is None else float(d.get("busbw_factor", 0.0)),
            dtensor_op=d.get("dtensor_op"),
            placements=d.get("placements"),
            mesh=d.get("mesh"),
            source=d.get("source"),
            latency_s=d.get("latency_s"),
            peer=d.get("peer"),
            p2p_seq=d.get("p2p_seq"),
            microbatch=d.get("microbatch"),
            start_s=d.get("start_s"),
            in_flight=bool(d.get("in_flight", False)),
            error=d.get("error"),
            unit=d.get("unit"),
            compiled=bool(d.get("compiled", False)),
            send_splits=_splits(d.get("send_splits")),
            recv_splits=_splits(d.get("recv_splits")),
        )


def _maybe_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _splits(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def check_noise_level(noise_level: object) -> int:
    if not isinstance(noise_level, int) or not 0 <= noise_level <= 3:
        raise ValueError(f"noise_level must be 0, 1, 2 or 3, got {noise_level!r}")
    return noise_level


def ops_at_noise(rows: Iterable[OpRow], noise_level: int) -> list[OpRow]:
    """The op rows a noise level shows: 0 none, 1 non-trivial DTensor ops, 2 non-trivial ops, 3 all."""
    if noise_level <= 0:
        return []
    if noise_level == 1:
        return [r for r in rows if r.is_dtensor and not r.is_trivial]
    if noise_level == 2:
        return [r for r in rows if not r.is_trivial]
    return list(rows)


# (reference key, canonical op, group name)
CollKey = tuple[str, str, str]


class Trace:
    """Everything recorded about one run on one rank.

    Counts are kept per (module, phase) with phases ``forward``, ``backward``, ``checkpoint``
    (activation-checkpoint recompute) and ``optimizer`` (inside ``optimizer.step()``). Collective counts include descendants, like the
    reference's; op rows are the module's own ops. Memory is bounded: ops and collectives are
    aggregated by signature, and only the last ``max_events`` collective events are kept.

    >>> import commdebug
    >>> trace = commdebug.load("comm_mode_log.json")       # doctest: +SKIP
    >>> [m for m, depth in trace.walk()][:2]                # doctest: +SKIP
    ['Global', 'Transformer']
    """

    def __init__(self, max_events: int | None = 20_000) -> None:
        self.modules: dict[str, ModuleInfo] = {GLOBAL: ModuleInfo(GLOBAL, None)}
        # group name -> GroupInfo, for every group a collective ran on
        self.groups: dict[str, GroupInfo] = {}
        # (fqn, phase) -> CollKey -> [count, bytes, unknown]; see ``collectives``
        self._collectives: dict[tuple[str, str], dict[CollKey, list[int]]] = {}
        # (path, phase, key, bytes, count) of collectives not yet counted: folded in bulk when
        # read, off the capture path (a dict update per module on the path costs microseconds)
        self._pending: list[tuple[Any, str, CollKey, int | None, int]] = []
        # (fqn, phase) -> op signature -> count; see ``ops``.
        self._ops: dict[tuple[str, str], dict[Any, int]] = {}
        # (fqn, phase) -> signatures of ops not yet counted. The capture side appends one per op
        # to the list of where it is, and ``Counter`` counts them in C in batches: cheaper than
        # a dict update per op.
        self._op_lists: dict[tuple[str, str], list] = {}
        self.max_events = max_events
        self.events: deque[CollectiveEvent] = deque(maxlen=max_events)
        self.events_total = 0
        self.step = 0
        self.metadata: dict[str, Any] = {}
        # the level the op rows were filtered at when this trace came from a dump
        self.noise_level = 3
        # False for a dump written by torch's CommDebugMode, which records no bytes
        self.bytes_recorded = True
        # the rank's torch.profiler trace (a commdebug.model.profile.Profile), read beside its dump
        self.profile: Any = None

    # ---- filling (capture side) -------------------------------------------------------------

    def add_module(self, fqn: str, parent: str | None, module_type: str = "", parameters: dict[str, str] | None = None) -> ModuleInfo:
        info = self.modules.get(fqn)
        if info is None:
            parent = parent if parent in self.modules else GLOBAL
            info = self.modules[fqn] = ModuleInfo(fqn, parent, module_type, dict(parameters or {}))
            self.modules[parent].children.append(fqn)
        return info

    @property
    def op_counts(self) -> dict[tuple[str, str], dict[Any, int]]:
        """(fqn, phase) -> op signature -> count.

        A signature is the op name (a plain op) or ``(name, shapes, placements, mesh)`` (an op
        on DTensors). Live signatures hold torch objects (torch.Size, placements, meshes) and
        are turned into text only when read, which keeps str() off the dispatch hot path.
        """
        for where, pending in self._op_lists.items():
            if pending:
                self.count_ops(where)
        return self._ops

    def op_list(self, fqn: str, phase: str) -> list:
        """The list the capture side appends op signatures of (fqn, phase) to."""
        pending = self._op_lists.get((fqn, phase))
        if pending is None:
            pending = self._op_lists[(fqn, phase)] = []
        return pending

    def count_ops(self, where: tuple[str, str]) -> None:
        """Fold the pending signatures of one (fqn, phase) into its counts."""
        pending = self._op_lists[where]
        counts = Counter(pending)
        pending.clear()  # in place: the capture side holds its append method
        bucket = self._ops.get(where)
        if bucket is None:
            bucket = self._ops[where] = {}
        for sig, n in counts.items():
            bucket[sig] = bucket.get(sig, 0) + n

    def add_group(self, group: GroupInfo) -> None:
        if group.name not in self.groups:
            self.groups[group.name] = group

    def group(self, name: str) -> GroupInfo:
        return self.groups.get(name, UNKNOWN_GROUP)

    @property
    def collectives(self) -> dict[tuple[str, str], dict[CollKey, list[int]]]:
        """(fqn, phase) -> collective key -> [count, bytes, unknown], each module counting its
        descendants' collectives too; ``bytes`` sums the known sizes, ``unknown`` counts the
        calls whose size is not known."""
        if self._pending:
            self._fold_collectives()
        return self._collectives

    def add_collective(self, path: Iterable[str], phase: str, key: CollKey, nbytes: int | None, count: int = 1) -> None:
        """Count a collective for every module on ``path`` (the call's module and its ancestors);
        ``nbytes`` None: its size is not known."""
        pending = self._pending
        pending.append((path if type(path) is tuple else tuple(path), phase, key, nbytes, count))
        if len(pending) >= 4096:
            self._fold_collectives()

    def _fold_collectives(self) -> None:
        # the same (path, phase, key) summed first: a training step repeats them
        sums: dict[tuple, list[int]] = {}
        for path, phase, key, nbytes, count in self._pending:
            agg = sums.get((path, phase, key))
            if agg is None:
                agg = sums[(path, phase, key)] = [0, 0, 0]
            agg[0] += count
            if nbytes is None:
                agg[2] += count
            else:
                agg[1] += nbytes
        self._pending = []
        for (path, phase, key), (count, nbytes, unknown) in sums.items():
            for fqn in path:
                bucket = self._collectives.setdefault((fqn, phase), {})
                agg = bucket.get(key)
                if agg is None:
                    bucket[key] = [count, nbytes, unknown]
                else:
                    agg[0] += count
                    agg[1] += nbytes
                    agg[2] += unknown

    def add_event(self, event: CollectiveEvent) -> None:
        self.events.append(event)
        self.events_total += 1

    def event(self, index: int) -> CollectiveEvent | None:
        """The event with this index, if still kept."""
        pos = index - self.events_dropped
        return self.events[pos] if 0 <= pos < len(self.events) else None

    def update_event(self, index: int, **fields: Any) -> CollectiveEvent | None:
        """Change fields of a kept event once they are known (its time under asynchronous
        timing, its in-flight flag at a hang); None if it was dropped (``max_events``)."""
        pos = index - self.events_dropped
        if not 0 <= pos < len(self.events):
            return None
        event = self.events[pos] = self.events[pos]._replace(**fields)
        return event

    # ---- reading (renderers, analysis) ------------------------------------------------------

    @property
    def events_dropped(self) -> int:
        return self.events_total - len(self.events)

    @property
    def steps(self) -> int:
        last = self.events[-1].step + 1 if self.events else 0
        return max(self.step, last, int(self.metadata.get("steps", 0) or 0))

    def walk(self) -> Iterator[tuple[str, int]]:
        """(fqn, depth) of every module, depth-first in first-call order, Global first."""
        stack = [(GLOBAL, 0)]
        while stack:
            fqn, depth = stack.pop()
            yield fqn, depth
            stack.extend((c, depth + 1) for c in reversed(self.modules[fqn].children))

    def collective_stats(self, fqn: str, phase: str) -> list[CollectiveStat]:
        bucket = self.collectives.get((fqn, phase), {})
        return [CollectiveStat(k[0], k[1], self.group(k[2]), c, known_bytes(b, u, c), u) for k, (c, b, u) in bucket.items()]

    def collective_counts(self, fqn: str, phase: str) -> dict[str, int]:
        """Reference key -> count for a module and phase (groups merged)."""
        out: dict[str, int] = {}
        for stat in self.collective_stats(fqn, phase):
            out[stat.key] = out.get(stat.key, 0) + stat.count
        return out

    def phase_totals(self, fqn: str, phase: str) -> tuple[int, int | None]:
        """(count, bytes) of all collectives of a module in a phase: ``bytes`` sums the known
        sizes, None when none is known (:meth:`unknown_sizes` counts the calls left out)."""
        count = nbytes = unknown = 0
        for c, b, u in self.collectives.get((fqn, phase), {}).values():
            count += c
            nbytes += b
            unknown += u
        return count, known_bytes(nbytes, unknown, count)

    def unknown_sizes(self, fqn: str, phase: str) -> int:
        """How many collectives of a module in a phase have a size not known (a trace without
        shapes): left out of :meth:`phase_totals`' bytes."""
        return sum(u for _, _, u in self.collectives.get((fqn, phase), {}).values())

    def operations(self, fqn: str, phase: str) -> list[OpRow]:
        """The module's own op rows in a phase, in first-seen order, identical rows merged."""
        merged: dict[tuple[str, tuple[str, ...], tuple[str, ...], str], int] = {}
        for sig, count in self.op_counts.get((fqn, phase), {}).items():
            name, shapes, shardings, mesh = (sig, (), (), None) if isinstance(sig, str) else sig
            text = (
                str(name),
                tuple(str(s) for s in shapes),
                tuple(str(s) for s in shardings),
                "" if mesh is None else str(mesh),
            )
            merged[text] = merged.get(text, 0) + count
        return [OpRow(*k, count=c) for k, c in merged.items()]

    def units(self) -> dict[tuple[str, str, str, str], Counter]:
        """(module, phase, reference key, group name) -> how many of its kept events carried
        each FSDP2 unit (the module whose parameters an all-gather gathers or whose gradients a
        reduce-scatter reduces); only lines with such events appear."""
        out: dict[tuple[str, str, str, str], Counter] = {}
        for e in self.events:
            if e.unit is not None:
                out.setdefault((e.module, e.phase, e.key, e.group.name), Counter())[e.unit] += 1
        return out

    def compiled(self) -> Counter:
        """(module, phase, reference key, group name) -> how many of its kept events compiled
        code issued (``torch.compile``); only lines with such events appear."""
        out: Counter = Counter()
        for e in self.events:
            if e.compiled:
                out[(e.module, e.phase, e.key, e.group.name)] += 1
        return out

    def totals(self) -> dict[str, Any]:
        """Collective count and bytes of the whole run, in total and per canonical op; where
        some sizes are not known, ``bytes`` sums the others (None when none is known) and
        ``unknown_size`` counts them."""
        by_op: dict[str, dict[str, Any]] = {}
        for phase in PHASES:
            for stat in self.collective_stats(GLOBAL, phase):
                agg = by_op.setdefault(stat.op, {"count": 0, "bytes": 0, "unknown_size": 0})
                agg["count"] += stat.count
                agg["bytes"] += stat.bytes or 0
                agg["unknown_size"] += stat.unknown
        count = sum(v["count"] for v in by_op.values())
        unknown = sum(v["unknown_size"] for v in by_op.values())
        for v in by_op.values():
            v["bytes"] = known_bytes(v["bytes"], v["unknown_size"], v["count"])
            if not v["unknown_size"]:
                del v["unknown_size"]
        out: dict[str, Any] = {"collectives": count, "bytes": known_bytes(sum(v["bytes"] or 0 for v in by_op.values()), unknown, count)}
        if unknown:
            out["unknown_size"] = unknown
        out["by_op"] = dict(sorted(by_op.items()))
        return out


def known_bytes(total: int, unknown: int, count: int) -> int | None:
    """A sum of message sizes where ``unknown`` of ``count`` calls have none: the sum of the
    known ones, or None when no call's size is known (never a 0 that would read as "nothing").

    >>> known_bytes(0, 3, 3) is None, known_bytes(4096, 1, 3)
    (True, 4096)
    """
    return None if count and unknown >= count else total
