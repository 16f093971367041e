"""What changed between two runs, or two parallel plans: ``commdebug diff A B``.

Compares, per module, phase and collective (its count key and group), the number of calls and
the bytes that the module issued itself (not its descendants', so a change is reported once,
where it happened). Dumps compare directly; folders compare rank by rank (a rank present in only one is
a difference too). Groups are compared by their label (``mesh_tp[4]``), not their name, which
torch numbers in creation order and may differ between two runs of the same plan.

Module names are compared without the wrappers that only rename them: ``_orig_mod``
(``torch.compile(module)``), ``_checkpoint_wrapped_module`` (activation checkpointing),
``_fsdp_wrapped_module`` (FSDP1), and FSDP2's ``FSDP`` class-name prefix on the root. A module
that exists on one side only (the submodules of a compiled block, which the compiled side never
sees) has its calls counted at its nearest ancestor that both sides have, so compiling a block
shows what compilation changed in its calls, not that its children went quiet. With
``ignore_groups``, groups are left out of the comparison (torch's own dumps have none).

Besides counts, each group's order of calls is compared (op and bytes, in issue order): the
same calls issued in another order is a difference too (compilation may reorder, and two ranks
issuing one group's calls in different orders deadlock).

How each side's process ended is compared too (``ended_by``, or its fault record, or a stream
without a final dump): a run that crashed has fewer calls, and the diff says why in a note. An
ending alone is no difference (a plan's regression test compares calls).

Use it as a regression test of a parallelization plan: record one step, keep the dump, and let
CI fail when ``commdebug diff`` exits 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commdebug.errors import CommDebugError, missing_path
from commdebug.formats.folders import job_files, rank_from_name
from commdebug.formats.readers import load
from commdebug.model.fault import fault_words
from commdebug.model.trace import PHASES, Trace

__all__ = ["Change", "Reorder", "Diff", "diff_traces", "diff_paths", "ending", "normalise_module"]

# path segments that wrap a module without changing what it does
_WRAPPERS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})


@dataclass(frozen=True)
class Change:
    rank: int | None  # None when two single dumps are compared
    module: str
    phase: str
    key: str  # the count key, e.g. c10d_functional.all_reduce
    group: str  # group label
    calls: tuple[int, int]  # (a, b)
    bytes: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "module": self.module, "phase": self.phase, "key": self.key, "group": self.group,
                "calls_a": self.calls[0], "calls_b": self.calls[1], "bytes_a": self.bytes[0], "bytes_b": self.bytes[1]}


@dataclass(frozen=True)
class Reorder:
    """One group's calls, the same on both sides, issued in another order."""

    rank: int | None
    group: str  # group label ("" with ignore_groups)
    position: int  # index of the first call that differs, in the group's issue order
    a: str  # that call in a: "op bytes"
    b: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "group": self.group, "position": self.position, "a": self.a, "b": self.b}


@dataclass
class Diff:
    """What :func:`diff_traces` found: count changes, reorders, and how many modules were
    counted at an ancestor because only one side has them."""

    changes: list[Change]
    reorders: list[Reorder]
    rolled_up: int = 0
    ended: tuple[str, str] | None = None  # how each side's process ended, where they differ (both known)
    rank: int | None = None

    def __bool__(self) -> bool:
        return bool(self.changes or self.reorders)


def ending(trace: Trace) -> str | None:
    """How a recorded process ended: its fault record's words (a fatal signal before its final
    dump), ``metadata.ended_by`` ("exit", "RuntimeError: ..."), "without a final dump" for a
    stream without either; None where the dump does not say (older dumps, torch's own)."""
    fault = trace.metadata.get("fault")
    if isinstance(fault, dict) and not fault.get("after_final_dump"):
        return fault_words(fault)
    ended = trace.metadata.get("ended_by")
    if ended:
        return str(ended)
    return "without a final dump" if trace.metadata.get("stream") else None


def normalise_module(fqn: str) -> str:
    """A module path without the wrappers that only rename it.

    >>> normalise_module("Net.layers.0._checkpoint_wrapped_module.attn")
    'Net.layers.0.attn'
    """
    parts = fqn.split(".")
    if any(p in _WRAPPERS for p in parts):
        parts = [p for p in parts if p not in _WRAPPERS]
    return ".".join(parts)


def _names(trace: Trace, other_root: set[str]) -> dict[str, str]:
    """fqn -> its name for comparison; FSDP2's "FSDP<Root>" class rename counts as <Root> when
    the other side's root is <Root>."""
    names = {}
    for fqn in trace.modules:
        name = normalise_module(fqn)
        head, dot, rest = name.partition(".")
        if head.startswith("FSDP") and head[4:] in other_root:
            name = head[4:] + dot + rest
        names[fqn] = name
    return names


def _own(trace: Trace, names: dict[str, str], group_of: Any) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    """(module name, phase, key, group) -> (calls, bytes) issued by the module itself.

    The trace's counts include descendants (as the reference's do); a change there would show
    on every ancestor. Subtracting the children's leaves each call on the module that issued it,
    so one changed call is one line."""
    inclusive: dict[str, dict[tuple[str, str, str], tuple[int, int]]] = {}
    for fqn, _ in trace.walk():
        mine = inclusive[fqn] = {}
        for phase in PHASES:
            for stat in trace.collective_stats(fqn, phase):
                key = (phase, stat.key, group_of(stat.group))
                count, nbytes = mine.get(key, (0, 0))
                mine[key] = (count + stat.count, nbytes + (stat.bytes or 0))  # sizes not known: counts alone differ
    own: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    for fqn, mine in inclusive.items():
        left = {k: list(v) for k, v in mine.items()}
        for child in trace.modules[fqn].children:
            for key, (count, nbytes) in inclusive.get(child, {}).items():
                if key in left:
                    left[key][0] -= count
                    left[key][1] -= nbytes
        for key, v in left.items():
            if v != [0, 0]:
                full = (names.get(fqn, fqn), *key)
                count, nbytes = own.get(full, (0, 0))
                own[full] = (count + v[0], nbytes + v[1])
    return own


def _roll_up(own: dict, shared: set[str], parents: dict[str, str]) -> tuple[dict, int]:
    """Move the counts of modules the other side lacks to their nearest shared ancestor."""
    out: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    moved: set[str] = set()
    for (name, *rest), (count, nbytes) in own.items():
        target = name
        while target not in shared and target in parents:
            target = parents[target]
        if target != name:
            moved.add(name)
        key = (target, *rest)
        c, b = out.get(key, (0, 0))
        out[key] = (c + count, b + nbytes)
    return out, len(moved)


def _parents(trace: Trace, names: dict[str, str]) -> dict[str, str]:
    parents = {}
    for fqn, info in trace.modules.items():
        for child in info.children:
            parents[names.get(child, child)] = names.get(fqn, fqn)
    return parents


def _orders(trace: Trace, group_of: Any) -> dict[str, list[str]]:
    orders: dict[str, list[str]] = {}
    for e in trace.events:
        orders.setdefault(group_of(e.group), []).append(f"{e.op} {e.size_bytes}")
    return orders


def diff_traces(a: Trace, b: Trace, rank: int | None = None, *, ignore_groups: bool = False) -> Diff:
    """The differences between two traces: per module, phase and collective, in module order of
    ``a`` then ``b``; then each group's call order where the calls match but their order does
    not. ``ignore_groups`` compares without groups (against a dump written by torch's own
    CommDebugMode, which has none).

    >>> found = diff_traces(load("eager.json"), load("compiled.json"))   # doctest: +SKIP
    >>> bool(found), [c.module for c in found.changes]                   # doctest: +SKIP
    """
    group_of = (lambda g: "") if ignore_groups else (lambda g: g.label)
    roots_a = {normalise_module(f) for f, d in a.walk() if d == 0}
    roots_b = {normalise_module(f) for f, d in b.walk() if d == 0}
    names_a, names_b = _names(a, roots_b), _names(b, roots_a)
    shared = set(names_a.values()) & set(names_b.values())
    ta, moved_a = _roll_up(_own(a, names_a, group_of), shared, _parents(a, names_a))
    tb, moved_b = _roll_up(_own(b, names_b, group_of), shared, _parents(b, names_b))
    order: dict[str, int] = {}
    for trace, names in ((a, names_a), (b, names_b)):
        for fqn, _ in trace.walk():
            order.setdefault(names[fqn], len(order))
    changes = []
    for key in sorted(set(ta) | set(tb), key=lambda k: (order.get(k[0], 0), PHASES.index(k[1]) if k[1] in PHASES else 9, k[2], k[3])):
        ca, cb = ta.get(key, (0, 0)), tb.get(key, (0, 0))
        if ca != cb:
            changes.append(Change(rank, key[0], key[1], key[2], key[3], (ca[0], cb[0]), (ca[1], cb[1])))
    reorders = []
    oa, ob = _orders(a, group_of), _orders(b, group_of)
    for group in sorted(set(oa) & set(ob)):
        sa, sb = oa[group], ob[group]
        if sa != sb and sorted(sa) == sorted(sb):  # same calls, other order (count changes are above)
            i = next(i for i, (x, y) in enumerate(zip(sa, sb, strict=True)) if x != y)
            reorders.append(Reorder(rank, group, i, sa[i], sb[i]))
    ends = ending(a), ending(b)
    ended = (ends[0], ends[1]) if ends[0] is not None and ends[1] is not None and ends[0] != ends[1] else None
    return Diff(changes, reorders, moved_a + moved_b, ended, rank)


def diff_paths(a: str | os.PathLike, b: str | os.PathLike, *, ignore_groups: bool = False,
               progress: Callable[[int, int], None] | None = None) -> Iterator[Diff]:
    """Differences between two dumps, or two folders of rank dumps (each may be a folder of
    per-node folders), rank by rank; ``progress(done, total)`` is told after each rank of two
    folders is compared."""
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):  # before comparing kinds: a missing path is neither
        if not p.exists():
            raise missing_path(p)
    if pa.is_dir() != pb.is_dir():
        raise CommDebugError(f"compare a dump with a dump, or a folder with a folder: {pa} and {pb}")
    if not pa.is_dir():
        yield diff_traces(load(pa), load(pb), ignore_groups=ignore_groups)
        return
    fa = {rank_from_name(f): f for f in job_files(pa)}  # each folder must be one run
    fb = {rank_from_name(f): f for f in job_files(pb)}
    empty = Trace()
    ranks = sorted(set(fa) | set(fb))
    for done, rank in enumerate(ranks, 1):
        ta = load(fa[rank]) if rank in fa else empty
        tb = load(fb[rank]) if rank in fb else empty
        yield diff_traces(ta, tb, rank, ignore_groups=ignore_groups)
        if progress is not None:
            progress(done, len(ranks))
