"""The full capture's autograd markers: tensor hooks a module call leaves on its inputs and
outputs (see :mod:`commdebug.capture.tracker`), set per module call, so kept cheap."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["add_tensor_hook", "tensors_in"]

_Tensor = torch.Tensor


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a module call's arguments or output (positional tuples without pytree)."""
    if isinstance(value, _Tensor):
        return [value]
    if type(value) is tuple:  # the common case, positional args, without pytree
        out = []
        for v in value:
            if isinstance(v, _Tensor):
                out.append(v)
            elif isinstance(v, (list, tuple, dict)):
                break
        else:
            return out
    return [t for t in tree_leaves(value) if isinstance(t, _Tensor)]


_hook_keys = itertools.count()


def add_tensor_hook(t: torch.Tensor, hook: Callable, first: bool = False) -> None:
    """``t.register_hook(hook)`` without its handle, about 5x cheaper (it runs per module call).

    Autograd calls the hooks in the raw order of ``t._backward_hooks`` (``move_to_end`` only
    changes the OrderedDict's own view), so ``first`` refills the dict with ours in front.
    Keys are ours, never ints, so they cannot collide with torch's handle ids (torch types the
    dict by int keys). A leaf tensor (no ``grad_fn``) takes the hook as ``register_hook`` gives
    it one.
    """
    hooks: dict[Any, Callable] | None = t._backward_hooks
    if hooks is None:
        t._backward_hooks = hooks = OrderedDict()
        node = t.grad_fn
        if node is not None:
            node._register_hook_dict(t)
    key = ("commdebug", next(_hook_keys))
    if first and hooks:
        others = list(hooks.items())
        hooks.clear()
        hooks[key] = hook
        hooks.update(others)
    else:
        hooks[key] = hook
