"""Which ranks of a job the files read hold, and what to make of the others.

Jobs that span hosts often write a folder per node (node-local disks): one node's folder holds
its own ranks and says the world is larger. A rank missing from the files read is then one of
two things, and every verb that reads a folder tells them apart the same way
(:func:`absence`):

- **not in this folder** (``elsewhere``): it left nothing here (no dump, no stream, no fault
  record) and the dumps present place it on a host none of them ran on. It is no finding:
  verdicts and figures cover the ranks present, and a note names the absent ones and where they
  may be (the other folders beside this one, or the other nodes);
- **left nothing** (``here``): the dumps present place it on a host whose folder this is (by
  the launcher's LOCAL_WORLD_SIZE and node rank, or between two ranks of one host), or it left a
  fault record here: a rank of this folder that wrote no dump, as before (``check``'s
  ``no_dump``).

Where the dumps carry no placement (dumps from before it was recorded, ranks started by
``mp.spawn``), a missing rank between two ranks of one host belongs here; one beyond every
host's ranks may be on another node.

>>> placements = {2: Placement("node1", 2, 1), 3: Placement("node1", 2, 1)}
>>> a = absence(4, placements, FolderScope(("run/node1",), beside=("run/node0",)))
>>> a.elsewhere, a.here
((0, 1), ())
>>> a.note()
'ranks 0-1 of 4 are not in run/node1 (no dump, stream or fault record of theirs): they may be in run/node0 beside it; read the parent folder for the whole job'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from commdebug.units import who

__all__ = ["Placement", "FolderScope", "Absence", "placement_of", "absence"]


@dataclass(frozen=True)
class Placement:
    """Where the launcher put one rank: its host, and (torchrun) how many ranks its node ran and
    the node's rank; ``pid`` ties a fault record named by pid to it."""

    host: str | None
    local_world_size: int | None = None
    node_rank: int | None = None
    pid: int | None = None


def placement_of(meta: Mapping[str, Any]) -> Placement:
    """A rank's :class:`Placement` from its dump's metadata (``hostname``, ``local_world_size``,
    ``node_rank``, ``pid``)."""
    def whole(key: str) -> int | None:
        value = meta.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    host = meta.get("hostname")
    return Placement(host if isinstance(host, str) else None, whole("local_world_size"), whole("node_rank"), whole("pid"))


@dataclass(frozen=True)
class FolderScope:
    """What the reader saw around the rank files: the folders read (as named), ``faulted``: the
    ranks with a fault record in them, ``pid_faults``: the pids of records named by pid (a rank
    that died before its rank was known), and ``beside``: other folders next to them that hold
    rank files (where absent ranks may be). ``files_only``: the files were named one by one, so
    a rank not named is not judged."""

    folders: tuple[str, ...]
    faulted: frozenset[int] = frozenset()
    pid_faults: frozenset[int] = frozenset()
    beside: tuple[str, ...] = ()
    files_only: bool = False

    def where(self) -> str:
        """"run/node1", "run/node0, run/node1", or "the files given"."""
        if self.files_only or not self.folders:
            return "the files given"
        return ", ".join(self.folders[:3]) + (f" and {len(self.folders) - 3} more folders" if len(self.folders) > 3 else "")


@dataclass(frozen=True)
class Absence:
    """The ranks of a job the files read do not hold: ``elsewhere`` (not in this folder: no
    finding) and ``here`` (left nothing in their own folder: judged as a rank without a dump)."""

    world_size: int
    present: tuple[int, ...]
    elsewhere: tuple[int, ...] = ()
    here: tuple[int, ...] = ()
    scope: FolderScope | None = field(default=None, compare=False)

    @property
    def partial(self) -> bool:
        """Whether some ranks of the job are not in the files read."""
        return bool(self.elsewhere)

    def among(self) -> str:
        """"among ranks 2-3 of 4": what a verdict over the ranks present covers ("" when every
        rank of the job is here)."""
        if not self.elsewhere:
            return ""
        return f"among {who(self.present)} of {self.world_size}"

    def note(self) -> str | None:
        """The one line every verb says about ranks not in this folder, or None."""
        if not self.elsewhere:
            return None
        n = len(self.elsewhere)
        them = f"{who(self.elsewhere)} of {self.world_size}"
        scope = self.scope
        if scope is None:
            return f"{them} {'are' if n != 1 else 'is'} not among the dumps read: the figures cover the ranks present"
        if scope.files_only:
            return (f"{them} {'are' if n != 1 else 'is'} not among the files given: the figures cover the ranks given; "
                    "name every rank's file, or their folders, for the whole job")
        they, theirs = ("they", "theirs") if n != 1 else ("it", "its own")
        head = f"{them} {'are' if n != 1 else 'is'} not in {scope.where()} (no dump, stream or fault record of {theirs})"
        if scope.beside:
            shown = ", ".join(scope.beside[:3]) + (f" and {len(scope.beside) - 3} more" if len(scope.beside) > 3 else "")
            return f"{head}: {they} may be in {shown} beside it; read the parent folder for the whole job"
        return (f"{head}: {they} may be on the other nodes; read every node's folder together for the whole job "
                "(commdebug check DIR1 DIR2, or their parent folder)")

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "ranks_present": list(self.present), "ranks_absent": list(self.elsewhere),
                "ranks_without_dump": list(self.here)}


def absence(world_size: int, placements: Mapping[int, Placement], scope: FolderScope | None = None,
            files_here: Iterable[int] = ()) -> Absence:
    """Sort the ranks of a world of `world_size` that `placements` (rank -> placement of each
    rank present) lacks into not here and here (see the module docstring); `files_here`: ranks
    with a file here that was not read (a stream just created, with no whole line yet)."""
    present = tuple(sorted(placements))
    missing = sorted(set(range(world_size)) - set(present))
    if not missing:
        return Absence(world_size, present, scope=scope)
    if scope is not None and scope.files_only:
        return Absence(world_size, present, tuple(missing), (), scope)
    pids = {p.pid for p in placements.values() if p.pid is not None}
    if scope is not None and scope.pid_faults - pids:
        # a process died before its rank was known: it may be any missing rank, so none is called absent
        return Absence(world_size, present, (), tuple(missing), scope)
    blocks = list(_host_blocks(placements))
    left = (scope.faulted if scope is not None else frozenset()) | set(files_here)
    here = [r for r in missing if r in left or any(lo <= r <= hi for lo, hi in blocks)]
    elsewhere = [r for r in missing if r not in here]
    return Absence(world_size, present, tuple(elsewhere), tuple(here), scope)


def _host_blocks(placements: Mapping[int, Placement]) -> Iterable[tuple[int, int]]:
    """Per host of the ranks present, the ranks its folder should hold (inclusive): the node's
    block of LOCAL_WORLD_SIZE ranks (torchrun numbers a node's ranks consecutively), or, without
    it, the span from its lowest rank present to its highest."""
    hosts: dict[str | None, list[tuple[int, Placement]]] = {}
    for rank, p in placements.items():
        hosts.setdefault(p.host, []).append((rank, p))
    for members in hosts.values():
        ranks = [r for r, _ in members]
        sizes = {p.local_world_size for _, p in members}
        nodes = {p.node_rank for _, p in members}
        size = sizes.pop() if len(sizes) == 1 else None
        if size:
            node = nodes.pop() if len(nodes) == 1 else None
            first = (node if node is not None else min(ranks) // size) * size
            yield first, first + size - 1
        else:
            yield min(ranks), max(ranks)
