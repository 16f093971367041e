"""FSDP2's hooks, wrapped while recording: some facts about its collectives are known only there.

- ``FSDPParamGroup.post_backward``: the reduce-scatter belongs to the module whose backward just
  finished, and carries that module's gradients (also from FSDP2's final callback, where no
  module's backward runs).
- ``FSDPParamGroup.unshard``: an all-gather names the module whose parameters it gathers
  (FSDP2 prefetches the next module's from the current one's hooks).
- ``FSDPState._pre_backward``: in a light step, the unshard and prefetches of a module's
  pre-backward belong to that module. The full capture's markers already say so; a light step
  would otherwise take the module that made the output's autograd node, which is a child's when
  the module returns its child's output (see :mod:`commdebug.capture.calls`).

The wrappers read the trackers from ``patch.users`` (``active``, ``calls``, ``unit``,
``backward_of``, ``name_of``): this module does not import the tracker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from commdebug.capture.patches import ClassPatch

__all__ = ["FSDP_PATCHES"]


def _unit_name(tracker: Any, modules: Any) -> str | None:
    names = [tracker.name_of(m) for m in modules]
    return ", ".join(names) if names else None


def _fsdp_post_backward(original: Any, patch: ClassPatch) -> Any:
    """The post-backward reduce-scatter belongs to the module whose backward just finished, and
    carries that module's gradients."""

    def post_backward(group: Any, *args: Any, **kwargs: Any) -> Any:
        modules: Sequence[Any] = getattr(group, "modules", ())  # FSDPParamGroup.modules
        trackers = [t for t in patch.users if t.active]
        if not trackers:
            return original(group, *args, **kwargs)
        # fully_shard([a, b]): no one module to put the location on, but the unit has names
        saved = [(t, t.backward_of(modules[0]) if len(modules) == 1 else None, t.unit) for t in trackers]
        for t in trackers:
            t.unit = _unit_name(t, modules)
        try:
            return original(group, *args, **kwargs)
        finally:
            for t, path, unit in saved:
                if path is not None:
                    t.restore_backward(path)
                t.unit = unit

    return post_backward


def _fsdp_unshard(original: Any, patch: ClassPatch) -> Any:
    """An all-gather names the module whose parameters it gathers: FSDP2 prefetches the next
    module's parameters from the current one's hooks, where the location alone misleads."""

    def unshard(group: Any, *args: Any, **kwargs: Any) -> Any:
        trackers = [t for t in patch.users if t.active]
        if not trackers:
            return original(group, *args, **kwargs)
        saved = [(t, t.unit) for t in trackers]
        for t in trackers:
            t.unit = _unit_name(t, getattr(group, "modules", ()))
        try:
            return original(group, *args, **kwargs)
        finally:
            for t, unit in saved:
                t.unit = unit

    return unshard


def _fsdp_pre_backward(original: Any, patch: ClassPatch) -> Any:
    def _pre_backward(state: Any, *args: Any, **kwargs: Any) -> Any:
        modules: Sequence[Any] = getattr(state, "_modules", ())  # FSDPState._modules
        trackers = [t for t in patch.users if t.active and t.calls] if len(modules) == 1 else []
        saved = [(t, t.backward_of(modules[0])) for t in trackers]
        try:
            return original(state, *args, **kwargs)
        finally:
            for t, path in saved:
                t.restore_backward(path)

    return _pre_backward


FSDP_PATCHES = (
    ClassPatch("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup",
               {"post_backward": _fsdp_post_backward, "unshard": _fsdp_unshard}),
    ClassPatch("torch.distributed.fsdp._fully_shard._fsdp_state", "FSDPState", {"_pre_backward": _fsdp_pre_backward}),
)
