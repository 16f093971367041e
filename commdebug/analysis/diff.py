"""What changed between two runs, or two parallel plans: ``commdebug diff A B``.

Compares, per module, phase and collective (its count key and group), the number of calls and
the bytes that the module issued itself (not its descendants', so a change is reported once,
where it happened). Dumps compare directly; folders compare rank by rank (a rank present in only one is
a difference too). Groups are compared by their label (``mesh_tp[4]``), not their name, which
torch numbers in creation order and may differ between two runs of the same plan.

Use it as a regression test of a parallelization plan: record one step, keep the dump, and let
CI fail when ``commdebug diff`` exits 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from commdebug.errors import CommDebugError, DumpError
from commdebug.formats.readers import job_files, load, rank_from_name
from commdebug.model.trace import PHASES, Trace

__all__ = ["Change", "diff_traces", "diff_paths"]


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


def _table(trace: Trace) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    """(module, phase, key, group label) -> (calls, bytes) issued by the module itself.

    The trace's counts include descendants (as the reference's do); a change there would show
    on every ancestor. Subtracting the children's leaves each call on the module that issued it,
    so one changed call is one line."""
    inclusive: dict[str, dict[tuple[str, str, str], tuple[int, int]]] = {}
    for fqn, _ in trace.walk():
        mine = inclusive[fqn] = {}
        for phase in PHASES:
            for stat in trace.collective_stats(fqn, phase):
                key = (phase, stat.key, stat.group.label)
                count, nbytes = mine.get(key, (0, 0))
                mine[key] = (count + stat.count, nbytes + stat.bytes)
    own: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    for fqn, mine in inclusive.items():
        left = {k: list(v) for k, v in mine.items()}
        for child in trace.modules[fqn].children:
            for key, (count, nbytes) in inclusive.get(child, {}).items():
                if key in left:
                    left[key][0] -= count
                    left[key][1] -= nbytes
        own.update(((fqn, *key), (v[0], v[1])) for key, v in left.items() if v != [0, 0])
    return own


def diff_traces(a: Trace, b: Trace, rank: int | None = None) -> list[Change]:
    """The differences between two traces, in module order of ``a`` then ``b``."""
    ta, tb = _table(a), _table(b)
    order = {fqn: i for i, (fqn, _) in enumerate(a.walk())}
    for fqn, _ in b.walk():
        order.setdefault(fqn, len(order))
    changes = []
    for key in sorted(set(ta) | set(tb), key=lambda k: (order.get(k[0], 0), PHASES.index(k[1]) if k[1] in PHASES else 9, k[2], k[3])):
        ca, cb = ta.get(key, (0, 0)), tb.get(key, (0, 0))
        if ca != cb:
            changes.append(Change(rank, key[0], key[1], key[2], key[3], (ca[0], cb[0]), (ca[1], cb[1])))
    return changes


def diff_paths(a: str | os.PathLike, b: str | os.PathLike) -> Iterator[Change]:
    """Differences between two dumps, or two folders of rank dumps, rank by rank."""
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):  # before comparing kinds: a missing path is neither
        if not p.exists():
            raise DumpError(f"{p}: no such file or folder")
    if pa.is_dir() != pb.is_dir():
        raise CommDebugError(f"compare a dump with a dump, or a folder with a folder: {pa} and {pb}")
    if not pa.is_dir():
        yield from diff_traces(load(pa), load(pb))
        return
    fa = {rank_from_name(f): f for f in job_files(pa)}  # each folder must be one run
    fb = {rank_from_name(f): f for f in job_files(pb)}
    empty = Trace()
    for rank in sorted(set(fa) | set(fb)):
        ta = load(fa[rank]) if rank in fa else empty
        tb = load(fb[rank]) if rank in fb else empty
        yield from diff_traces(ta, tb, rank)

