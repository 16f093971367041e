"""Resolve the process group a collective ran on into a :class:`GroupInfo` (name, desc, size,
global ranks)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.distributed as dist

from commdebug.model.trace import UNKNOWN_GROUP, GroupInfo

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

__all__ = ["GroupResolver", "peer_rank"]


class GroupResolver:
    """Caches group lookups: a training loop hits the same few groups thousands of times."""

    def __init__(self) -> None:
        self._by_name: dict[str, GroupInfo] = {}
        # name -> the ProcessGroup object, for timing hooks. Weak: a group kept alive past
        # destroy_process_group() keeps gloo's worker threads running into interpreter teardown,
        # where torch 2.13 can abort the process (docs/ranks.md).
        self._pgs: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._crosses: dict[str, bool] = {}
        self._stream_waits: dict[str, bool] = {}

    def crosses_nodes(self, group: GroupInfo, peer: int | None, rank: int, per_node: int) -> bool:
        """Whether a collective leaves the node: its group (or, for send/recv, its peer) spans
        more than one node of ``per_node`` consecutive ranks. Unknown ranks count as crossing:
        better recorded than lost."""
        if peer is not None:
            return peer // per_node != rank // per_node
        crosses = self._crosses.get(group.name)
        if crosses is None:
            ranks = group.ranks
            crosses = self._crosses[group.name] = ranks is None or len({r // per_node for r in ranks}) > 1
        return crosses

    def pg(self, name: str) -> Any:
        """The ProcessGroup object of a group resolved before, or None."""
        return self._pgs.get(name)

    def waits_on_stream(self, name: str) -> bool:
        """Whether a wait on the group returns at once on the host, having made the current
        CUDA stream wait (NCCL): :func:`commdebug.capture.timing.waits_on_stream`, once per group."""
        if name not in self._stream_waits:
            from commdebug.capture.timing import waits_on_stream

            self._stream_waits[name] = waits_on_stream(self.pg(name))
        return self._stream_waits[name]

    def resolve(self, spec_group: int | Literal["legacy"] | None, args: tuple) -> GroupInfo:
        if type(spec_group) is int and spec_group < len(args):  # the common case, cached
            value = args[spec_group]
            info = self._by_name.get(value) if type(value) is str else None
            if info is not None:
                return info
        if spec_group is None:
            return self._from_pg(args[1] if len(args) > 1 else None)
        if spec_group == "legacy":
            # old functional ops pass (..., tag, ranks, group_size)
            tag, ranks, size = args[-3], tuple(args[-2]), int(args[-1])
            return GroupInfo(tag or "ranks:" + ",".join(map(str, ranks)), "", size, ranks)
        value = args[spec_group] if spec_group < len(args) else None
        if isinstance(value, str):
            return self._from_name(value)
        return self._from_pg(value)

    def _from_name(self, name: str) -> GroupInfo:
        info = self._by_name.get(name)
        if info is None:
            try:
                from torch.distributed.distributed_c10d import _resolve_process_group

                # a group name is a str: torch 2.13 types it GroupName, older releases as str
                pg = self._pgs[name] = _resolve_process_group(cast("GroupName", name))
                info = _describe(pg, name)
            except Exception:  # a group torch no longer knows: keep the name
                info = GroupInfo(name, "", 0, None)
            self._by_name[name] = info
        return info

    def _from_pg(self, pg: Any) -> GroupInfo:
        if pg is None:
            return UNKNOWN_GROUP
        if isinstance(pg, torch.ScriptObject):
            # eager c10d ops carry the group as a TorchScript object
            try:
                pg = dist.ProcessGroup.unbox(pg)
            except Exception:
                return UNKNOWN_GROUP
        name = getattr(pg, "group_name", None) or str(id(pg))
        info = self._by_name.get(name)
        if info is None:
            info = self._by_name[name] = _describe(pg, name)
            self._pgs[name] = pg
        return info


def _describe(pg: Any, name: str) -> GroupInfo:
    try:
        size = int(pg.size())
    except Exception:
        size = 0
    try:
        ranks: tuple[int, ...] | None = tuple(dist.get_process_group_ranks(pg))
    except Exception:
        ranks = None
    desc = getattr(pg, "group_desc", "") or ""
    return GroupInfo(name, str(desc), size, ranks)


def peer_rank(spec: Any, args: tuple, group: GroupInfo) -> int | None:
    """The other side of a send/recv (``spec``: its ops.py row) as a global rank: the ops carry
    the rank within the group."""
    if spec.peer is None or spec.peer >= len(args):
        return None
    rank = int(args[spec.peer])
    ranks = group.ranks
    return ranks[rank] if ranks is not None and 0 <= rank < len(ranks) else rank
