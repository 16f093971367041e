"""Resolve the process group a collective ran on into (name, size, global ranks)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist

__all__ = ["GroupInfo", "GroupResolver"]


class GroupInfo(NamedTuple):
    name: str
    size: int
    ranks: tuple[int, ...] | None


class GroupResolver:
    """Caches group lookups: a training loop hits the same few groups thousands of times."""

    def __init__(self) -> None:
        self._by_name: dict[str, GroupInfo] = {}

    def resolve(self, spec_group: int | str | None, args: tuple) -> GroupInfo:
        if spec_group is None:
            return self._from_pg(args[1] if len(args) > 1 else None)
        if spec_group == "legacy":
            # old functional ops pass (..., tag, ranks, group_size)
            tag, ranks, size = args[-3], tuple(args[-2]), int(args[-1])
            return GroupInfo(tag or "ranks:" + ",".join(map(str, ranks)), size, ranks)
        value = args[spec_group] if spec_group < len(args) else None
        if isinstance(value, str):
            return self._from_name(value)
        return self._from_pg(value)

    def _from_name(self, name: str) -> GroupInfo:
        info = self._by_name.get(name)
        if info is None:
            try:
                from torch.distributed.distributed_c10d import _resolve_process_group

                info = self._describe(_resolve_process_group(name), name)
            except Exception:  # a group torch no longer knows: keep the name
                info = GroupInfo(name, 0, None)
            self._by_name[name] = info
        return info

    def _from_pg(self, pg: Any) -> GroupInfo:
        if pg is None:
            return GroupInfo("?", 0, None)
        if isinstance(pg, torch.ScriptObject):
            # eager c10d ops carry the group as a TorchScript object
            try:
                pg = dist.ProcessGroup.unbox(pg)
            except Exception:
                return GroupInfo("?", 0, None)
        name = getattr(pg, "group_name", None) or str(id(pg))
        info = self._by_name.get(name)
        if info is None:
            info = self._describe(pg, name)
            self._by_name[name] = info
        return info

    @staticmethod
    def _describe(pg: Any, name: str) -> GroupInfo:
        try:
            size = int(pg.size())
        except Exception:
            size = 0
        try:
            ranks: tuple[int, ...] | None = tuple(dist.get_process_group_ranks(pg))
        except Exception:
            ranks = None
        return GroupInfo(name, size, ranks)
