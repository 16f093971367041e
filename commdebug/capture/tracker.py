"""Which module is running, and in which phase, while the dispatch mode sees an op.

Forward: a global forward pre-hook pushes the module on a stack; a forward hook registered on
each module the first time it runs pops it. That hook sits after the module's own forward hooks
(tensor parallelism's output redistribution lives there), so their collectives belong to the
module, as in the reference; a global forward hook would run before them.

Backward: when the autograd node that made a module call's output is about to run (a pre-hook
put on that node at the end of the call's forward), that call's module path becomes the backward
location, and stays until the next one fires: the moment the reference's full-backward pre-hook
fires, without wrapping every module in BackwardHook nodes. One pre-hook per distinct node is
also less Python work per module call than ``register_multi_grad_hook``'s per-tensor wrappers.

A forward pre-hook firing during backward is activation-checkpoint recompute.

The dispatch mode reads ``stack`` and ``bw_path`` directly: it runs for every op, and a method
call there would cost more than the lookup itself.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves

from commdebug.model.trace import GLOBAL

__all__ = ["ModuleTracker", "FORWARD", "BACKWARD", "CHECKPOINT"]

FORWARD, BACKWARD, CHECKPOINT = "forward", "backward", "checkpoint"
_graph_task_id = torch._C._current_graph_task_id


class ModuleTracker:
    """Keeps ``stack`` (running forwards, innermost last) and ``bw_path`` (backward location).

    ``on_first_call(module, fqn, parent_fqn)`` is called the first time a module runs forward.
    """

    def __init__(self, on_first_call: Callable[[torch.nn.Module, str, str], None]) -> None:
        self._on_first_call = on_first_call
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._named: weakref.WeakSet = weakref.WeakSet()
        self._called: weakref.WeakSet = weakref.WeakSet()
        self.stack: list[str] = []
        self.bw_path: tuple[str, ...] = (GLOBAL,)
        self._last_node_id = 0
        self._ancestors: dict[str, tuple[str, ...]] = {}
        self._handles: list = []

    # Names follow the reference: a module first seen with no known parent is named by its class,
    # its submodules "Parent.child", so keys match torch's CommDebugMode.
    def name_of(self, mod: torch.nn.Module) -> str:
        name = self._names.get(mod)
        if name is None:
            name = self._names[mod] = type(mod).__name__
        if mod not in self._named:
            self._named.add(mod)
            for child_name, child in mod.named_children():
                if child not in self._names:
                    self._names[child] = f"{name}.{child_name}"
                self.name_of(child)
        return name

    def path(self, phase: str) -> tuple[str, ...]:
        """The current module and all its running ancestors, Global first, each once."""
        if phase == BACKWARD:
            return self.bw_path
        if phase == CHECKPOINT and self.stack:
            # recompute re-runs a checkpointed module without its parents: take the ancestors
            # it had in the real forward
            return tuple(dict.fromkeys((*self._ancestors.get(self.stack[0], (GLOBAL,)), *self.stack)))
        return tuple(dict.fromkeys((GLOBAL, *self.stack)))

    def _pre_hook(self, mod: torch.nn.Module, args: tuple) -> None:
        fqn = self.name_of(mod)
        in_forward = _graph_task_id() == -1
        if in_forward:
            # a new forward: backward locations from an earlier step are stale
            self.bw_path = (GLOBAL,)
            self._ancestors[fqn] = (GLOBAL, *self.stack)
        if mod not in self._called:
            self._called.add(mod)
            self._handles.append(mod.register_forward_hook(self._post_hook, always_call=True))
            self._on_first_call(mod, fqn, self.stack[-1] if self.stack else GLOBAL)
        self.stack.append(fqn)

    def _post_hook(self, mod: torch.nn.Module, args: tuple, output: object) -> None:
        fqn = self._names.get(mod)
        if fqn is None or fqn not in self.stack:
            return
        path = tuple(dict.fromkeys((GLOBAL, *self.stack)))
        # unwind to this module even if an inner forward raised before its post-hook ran
        while self.stack and self.stack.pop() != fqn:
            pass
        if _graph_task_id() != -1:
            return  # checkpoint recompute: backward locations were set in the real forward
        nodes = {id(n): n for t in tree_leaves(output) if isinstance(t, torch.Tensor) and (n := t.grad_fn) is not None}
        for node in nodes.values():
            node.register_prehook(self._backward_marker(path, id(node)))

    def _backward_marker(self, path: tuple[str, ...], node_id: int) -> Callable:
        def mark(grad_outputs: object) -> None:
            # A module returning its child's output shares the node, so both markers fire on
            # it, the outer one last; the innermost module is where backward is.
            same_node = node_id == self._last_node_id
            self._last_node_id = node_id
            if same_node and len(path) < len(self.bw_path) and self.bw_path[: len(path)] == path:
                return
            self.bw_path = path

        return mark

    def __enter__(self) -> "ModuleTracker":
        self.stack.clear()
        self.bw_path = (GLOBAL,)
        self._handles = [register_module_forward_pre_hook(self._pre_hook)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._called = weakref.WeakSet()
        self.stack.clear()
