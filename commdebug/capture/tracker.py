"""Which module is running, and in which phase, while the dispatch mode sees an op.

Forward: a global forward pre-hook pushes the module; a forward hook registered on each module
the first time it runs pops it. That hook sits after the module's own forward hooks (tensor
parallelism's output redistribution lives there), so their collectives belong to the module, as
in the reference; a global forward hook would run before them.

Backward follows what autograd does, with two markers per module call:

- *entry*: when the gradient of the call's outputs reaches their autograd node, the call's
  module path becomes the backward location. It is a pre-hook on that node, so it runs after the
  tensor hooks that consumers registered on the same tensors (their exits, below). Where another
  library put its own tensor hooks on the output (FSDP2's pre-backward unshard), our entry is
  moved to the front of that tensor's hooks, so the unshard belongs to the module.
- *exit*: when the gradient of the call's inputs is complete, the module's backward is finished:
  the location goes back to the module itself (its children are done). A tensor hook on each
  input, registered before the module's own pre-hooks run, so hooks a module puts on its inputs
  (FSDP2's post-backward reduce-scatter, DDP-style gradient hooks) belong to the module, not to
  the child whose backward ran last.

A module whose output is one of its inputs' autograd nodes (Identity, Dropout(p=0)) did not
compute it and gets no entry, so it never takes its producer's backward collectives. When a
parent returns a child's output, both enter on the same node and the innermost stays.

Each outermost backward starts at Global; when it ends (an engine callback queued on its first
event) the location is the first top-level module of the forward, where FSDP2's final callback
reduce-scatters the root's gradients. That callback also finishes every FSDP2 module whose
post-backward hook never ran (the first block, when its inputs need no gradient): while
recording, ``FSDPParamGroup.post_backward`` is wrapped to put the location on its own module
for its duration, so each reduce-scatter belongs to the module whose gradients it carries. Nested backwards (reentrant checkpointing) restore the
location they interrupted.

A forward pre-hook firing during backward is activation-checkpoint recompute. Inside
``optimizer.step()`` the forward phase is ``optimizer``.

The dispatch mode reads ``stack``, ``fw_phase``, ``task`` and ``bw_path`` directly: it runs for
every op, and a method call there would cost more than the lookup itself.

Light steps need a location only per collective and track calls instead of hooks
(``use_calls``, ``_call``): :mod:`commdebug.capture.calls`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from commdebug.capture.calls import (
    MODULE_CALL,
    CallTracking,
    NodeRanges,
    current_node,
    hidden as _call_patch_hidden,
)
from commdebug.capture.compiled import MODULE_COMPILE, OPTIMIZED_CALL, CompiledCall, compiling
from commdebug.capture.fsdp import FSDP_PATCHES
from commdebug.capture.markers import add_tensor_hook, tensors_in
from commdebug.capture.source import in_compiled_code
from commdebug.model.trace import BACKWARD, CHECKPOINT, FORWARD, GLOBAL, OPTIMIZER

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleTracker"]

_GRAPH = ("", False)  # _hooked's value for a compiled module's graph: not tracked
_GLOBAL_PRE_HOOKS = torch.nn.modules.module._global_forward_pre_hooks
_graph_task_id = torch._C._current_graph_task_id
_compiling = compiling
_current_node = current_node


class ModuleTracker(CallTracking):
    """Keeps ``stack`` (running forwards, innermost last), ``paths`` (their module paths) and
    ``bw_path`` (the backward location: a module path, Global first).

    ``on_first_call(module, fqn, parent_fqn)`` is called the first time a module runs forward;
    ``on_move()`` whenever :meth:`location` may have changed, except by autograd starting or
    ending a graph task, which the caller notices itself (``torch._C._current_graph_task_id``);
    ``on_optimizer_step()`` when the outermost ``optimizer.step()`` returns, also while paused.
    """

    def __init__(
        self,
        on_first_call: Callable[[torch.nn.Module, str, str], None],
        on_move: Callable[[], None] = lambda: None,
        on_optimizer_step: Callable[[], None] = lambda: None,
    ) -> None:
        self._on_first_call = on_first_call
        self._on_move = on_move
        self._on_optimizer_step = on_optimizer_step
        self._optimizer_depth = 0  # optimizers calling a parent class's step() nest
        self.forwards = 0  # module calls seen, also while paused: steps count only after work
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._named: weakref.WeakSet = weakref.WeakSet()
        # modules with our forward hook in this context -> (fqn, has children): one weak lookup
        # per call
        self._hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.stack: list[str] = []
        self.paths: list[tuple[str, ...]] = []
        # (args, their tensors, whether the call's start went to the node-range log) per call
        self._calls: list[tuple[tuple, list[torch.Tensor], bool]] = []
        self.fw_phase = FORWARD
        self.bw_path: tuple[str, ...] = (GLOBAL,)
        self.task = -1  # graph task the backward state belongs to
        self._tasks: list[tuple[int, tuple[str, ...]]] = []  # open backwards, outermost first
        self._last_entry_node = 0
        # markers depend only on the module (exit) or its path (entry): built once, reused
        self._entries: dict[tuple[str, tuple[str, ...]], Callable] = {}
        self._exits: dict[str, Callable] = {}
        self._ancestors: dict[str, tuple[str, ...]] = {}
        self._root_path: tuple[str, ...] = (GLOBAL,)
        self._new_forward = True
        self._handles: list = []  # our forward hook on each module seen
        self._compiled: list[tuple[weakref.ref, CompiledCall]] = []  # compiled calls we wrap
        self._optimizer_handles: list = []
        self._pre_handle: RemovableHandle | None = None
        self.active = False
        # FSDP2: the module whose parameters the collectives issued now gather or reduce
        self.unit: str | None = None
        # light steps track calls, not hooks (commdebug.capture.calls): id(module) ->
        # [weakref, fqn, parent path last seen, path under it]; fqn None for a compiled graph
        self.calls = False
        self._known: dict[int, list] = {}
        self._param_owners: dict[int, list] = {}  # id(parameter) -> its module's entry in _known
        self._ranges = NodeRanges()
        self._pinned = 0  # backward_of put the location on a module: nodes do not decide it
        self._exit_node = 0  # id of the node an exit marker fired on, until its own work starts
        self._bw_found: tuple[str, ...] = (GLOBAL,)

    # Names follow the reference: a module first seen with no known parent is named by its class,
    # its submodules "Parent.child", so keys match torch's CommDebugMode.
    def name_of(self, mod: torch.nn.Module) -> str:
        name = self._names.get(mod)
        if name is None:
            # torch.compile(model) wraps the model: named by the model's class, as eager
            named = getattr(mod, "_orig_mod", mod) if type(mod).__name__ == "OptimizedModule" else mod
            name = self._names[mod] = type(named).__name__
        if mod not in self._named:
            self._named.add(mod)
            if mod._compiled_call_impl is not None:
                self.track_compiled(mod)
            for child_name, child in mod.named_children():
                if child not in self._names:
                    self._names[child] = f"{name}.{child_name}"
                self.name_of(child)
        return name

    def track_compiled(self, mod: torch.nn.Module) -> None:
        """Compiled code runs with our global hook hidden: Dynamo guards on the global hooks a
        compiled ``_call_impl`` reads, and would recompile whenever a recording starts or ends.

        ``mod.compile()`` also puts the module's own hooks inside the graph, where ours do
        nothing (Dynamo would otherwise bake them in): they run around the compiled call
        instead. ``torch.compile(mod)``'s wrapper module runs its own hooks eagerly: its call is
        wrapped for all recordings at once (``OPTIMIZED_CALL``)."""
        call = mod.__dict__.get("_compiled_call_impl")
        if call is None or isinstance(call, CompiledCall):
            return
        wrapper = CompiledCall(call, self, mod)
        mod._compiled_call_impl = wrapper
        self._compiled.append((weakref.ref(mod), wrapper))

    @contextmanager
    def global_hook_hidden(self) -> Iterator[None]:
        """Our global forward pre-hook out of torch's table for the duration (see
        :meth:`track_compiled`)."""
        handle = self._pre_handle
        hook = _GLOBAL_PRE_HOOKS.pop(handle.id, None) if handle is not None else None
        try:
            with _call_patch_hidden():
                yield
        finally:
            if hook is not None and handle is not None and self._pre_handle is handle:
                _GLOBAL_PRE_HOOKS[handle.id] = hook

    def location(self) -> tuple[str, str]:
        """(module fqn, phase) of an op dispatched now."""
        task = _graph_task_id()
        if task == -1:
            return (self.stack[-1] if self.stack else GLOBAL, self.fw_phase)
        if self.stack:
            return (self.stack[-1], CHECKPOINT)
        if task != self.task:
            self.begin_task()
        if self.calls:
            return (self._node_path()[-1], BACKWARD)
        return (self.bw_path[-1], BACKWARD)

    def where(self) -> tuple[str, str, tuple[str, ...]]:
        """(module fqn, phase, path) of a collective issued now: :meth:`location`, then
        :meth:`path`, whose last module names a backward collective's module (light capture's
        C++ kernel asks this once per collective)."""
        fqn, phase = self.location()
        path = self.path(phase)
        return (path[-1] if phase == BACKWARD else fqn), phase, path

    def path(self, phase: str) -> tuple[str, ...]:
        """The current module and all its running ancestors, Global first, each once (after
        :meth:`location`, for the collective it located). In backward its last module names the
        collective's module, which may be an ancestor of the one :meth:`location` gave
        (:meth:`_marked_or_ancestor`)."""
        if phase == BACKWARD:
            return self._bw_found if self.calls else self._marked_or_ancestor()
        return self.paths[-1] if self.paths else (GLOBAL,)

    def _marked_or_ancestor(self) -> tuple[str, ...]:
        """A backward collective's path under the markers (full capture): theirs, unless autograd
        runs a node that an ancestor of the marked module made outside it. Such a node is the
        ancestor's work: a redistribution its own forward did for all its children (torchtitan's
        sequence-parallel blocks all-gather their input inside the block's forward, not in a
        pre-hook), whose backward runs after the children's, with no marker of the ancestor's
        reached yet. Light steps find every backward collective's module this way."""
        marked = self.bw_path
        if self._pinned or len(marked) < 2:
            return marked
        node = _current_node()
        if node is None or id(node) == self._exit_node:  # a hook on an exiting module's inputs
            return marked
        made = self._ranges.find(node._sequence_nr())
        if made is not None and len(made) < len(marked) and marked[: len(made)] == made:
            return made
        return marked

    def path_of(self, mod: torch.nn.Module) -> tuple[str, ...]:
        """The module path a module had in its last forward (for work done on its behalf
        outside its forward, e.g. a pipeline stage's sends); registers it if never called."""
        if self.calls:
            fqn = (self._known.get(id(mod)) or self._know(mod))[1]
        else:
            known = self._hooked.get(mod)
            fqn = (known if known is not None else self._first_call(mod))[0]
        parent = self._ancestors.get(fqn, (GLOBAL,))
        return parent if fqn in parent else (*parent, fqn)

    # ---- forward ----------------------------------------------------------------------------

    def _pre_hook(self, mod: torch.nn.Module, args: tuple) -> None:
        if _compiling():
            return  # Dynamo traces the hooks of a compiled module: leave nothing in its graph
        self.forwards += 1
        known = self._hooked.get(mod)
        if known is None:
            known = self._first_call(mod)
        if known is _GRAPH:
            return
        fqn, parent_module = known
        paths = self.paths
        inputs: list[torch.Tensor] = []
        grad = torch.is_grad_enabled()
        if _graph_task_id() == -1:
            if paths:
                parent = paths[-1]
            else:
                parent = (GLOBAL,)
                if self._new_forward:  # the first top-level module since the last backward
                    self._new_forward = False
                    self._root_path = (GLOBAL, fqn)
                    self._tasks.clear()  # no backward runs now: drop any that raised midway
            self._ancestors[fqn] = parent
            if grad:
                inputs = tensors_in(args)
                # A leaf module's exit would only move backward back to the leaf, where it
                # already is (it has no children to leave), so leaves get none: most are leaves.
                if parent_module:
                    self._mark_exits(fqn, [t for t in inputs if t.grad_fn is not None])
        elif paths:
            parent = paths[-1]
        else:
            # checkpoint recompute re-runs a module without its parents: take the ancestors
            # it had in the real forward
            parent = self._ancestors.get(fqn, (GLOBAL,))
        self.stack.append(fqn)
        path = parent if fqn in parent else (*parent, fqn)
        paths.append(path)
        # the autograd numbers the call's nodes take, as light steps log them (NodeRanges): a
        # backward collective's node may belong to an ancestor of the markers' module
        if grad:
            self._log_start(path)
        self._calls.append((args, inputs, grad))
        self._on_move()

    def _first_call(self, mod: torch.nn.Module) -> tuple[str, bool]:
        if isinstance(mod, torch.fx.GraphModule) and mod not in self._names and in_compiled_code():
            # the graph a compiled module runs (AOTAutograd's, without Inductor): not a module of
            # the program; what it issues belongs to the compiled module around it
            self._hooked[mod] = _GRAPH
            return _GRAPH
        fqn = self.name_of(mod)
        known = self._hooked[mod] = (fqn, bool(mod._modules))
        post_hook = self._post_hook_for(fqn, known[1])
        self._handles.append(mod.register_forward_hook(post_hook, with_kwargs=True, always_call=True))
        self._on_first_call(mod, fqn, self.stack[-1] if self.stack else GLOBAL)
        return known

    def step_ended(self) -> None:
        """A step boundary: the autograd graphs of the step are gone, and so is the need to
        find the module calls that made their nodes."""
        self._ranges.clear()

    def use_calls(self, calls: bool) -> None:
        """Track module calls (light steps) or hooks (the dispatch mode's steps); switched at a
        step boundary, when no module runs."""
        if calls == self.calls:
            return
        active = self.active
        if active:
            self.pause()
        if calls:  # the hooks would keep every module on the slow call path
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self._hooked = weakref.WeakKeyDictionary()
        self.calls = calls
        if active:
            self.resume()
        self._on_move()

    def _post_hook_for(self, fqn: str, parent_module: bool) -> Callable:
        def post_hook(mod: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            if _compiling() or not self.active or fqn not in self.stack:
                return
            # unwind to this module even if an inner forward raised before its post-hook ran
            while True:
                top = self.stack.pop()
                path = self.paths.pop()
                pre_args, inputs, logged = self._calls.pop()
                if logged:
                    self._ranges.log_end()
                if top == fqn:
                    break
            self._on_move()
            if not torch.is_grad_enabled() or output is None:
                return
            # a checkpoint's recompute: entries only. A reentrant checkpoint ran the real
            # forward without gradients and backpropagates through the recomputed graph, which
            # needs them; a non-reentrant one never runs the recomputed graph's backward.
            if _graph_task_id() != -1:
                self._mark_entries(fqn, path, output, set())
                return
            if parent_module and (kwargs or args is not pre_args):
                # a pre-hook replaced the inputs (FSDP2 wraps them in its post-backward
                # function, tensor parallelism in DTensors), or kwargs the global pre-hook
                # could not see: the module's backward ends when their gradients are done
                seen = {id(t) for t in inputs}
                inputs = tensors_in(args) + (tensors_in(kwargs) if kwargs else [])
                self._mark_exits(fqn, [t for t in inputs if id(t) not in seen and t.grad_fn is not None])
            self._mark_entries(fqn, path, output, {id(t.grad_fn) for t in inputs})

        return post_hook

    def _mark_entries(self, fqn: str, path: tuple[str, ...], output: object, input_nodes: set[int]) -> None:
        done: set[int] = set()
        for t in tensors_in(output):
            node = t.grad_fn
            if node is None or id(node) in input_nodes or id(node) in done:
                continue  # nothing to mark, or the output is an input passed through
            done.add(id(node))
            entry = self._entries.get((fqn, path)) or self._entry_marker(fqn, path)
            if t._backward_hooks:
                add_tensor_hook(t, entry, first=True)  # else FSDP2's pre-backward runs first
            else:
                node.register_prehook(entry)

    # ---- backward ---------------------------------------------------------------------------

    def _entry_marker(self, fqn: str, path: tuple[str, ...]) -> Callable:
        def entry(_: object) -> None:
            if not self.active:
                return
            if _graph_task_id() != self.task:
                self.begin_task()
            # a parent returning its child's output enters on the same node after the child
            node = id(_current_node())
            if node == self._last_entry_node and fqn in self.bw_path:
                return
            self._last_entry_node = node
            if path is not self.bw_path:
                self.bw_path = path
                self._on_move()

        self._entries[(fqn, path)] = entry
        return entry

    def _mark_exits(self, fqn: str, inputs: list[torch.Tensor]) -> None:
        """Exit markers on a module call's inputs (non-leaf tensors: a hook would stay on a
        long-lived leaf), and on their nodes a pre-hook that says when the node's own work
        starts: its tensor hooks, the exit's and the module's own, have all run by then."""
        exit_hook = self._exits.get(fqn) or self._exit_marker(fqn)
        nodes = set()
        for t in inputs:
            add_tensor_hook(t, exit_hook)
            node = t.grad_fn
            if node is not None and id(node) not in nodes:  # callers pass non-leaf tensors only
                nodes.add(id(node))
                node.register_prehook(self._node_starts)

    def _node_starts(self, _: object) -> None:
        if self._exit_node == id(_current_node()):
            self._exit_node = 0

    def _exit_marker(self, fqn: str) -> Callable:
        def exit_(_: object) -> None:
            if not self.active:
                return
            if _graph_task_id() != self.task:
                self.begin_task()
            # until the node starts its own work, what its tensor hooks issue (hooks a module
            # put on its inputs) belongs to the module the exit names
            self._exit_node = id(_current_node())
            path = self.bw_path
            if fqn in path and path[-1] != fqn:
                self.bw_path = path[: path.index(fqn) + 1]
                self._on_move()

        self._exits[fqn] = exit_
        return exit_

    def begin_task(self) -> None:
        """Called on the first event of a backward (graph task) this tracker has not seen."""
        self.task = _graph_task_id()
        self._tasks.append((self.task, self.bw_path))
        if len(self._tasks) == 1:
            self.bw_path = (GLOBAL,)
            self._new_forward = True
        self._last_entry_node = 0
        torch.autograd.Variable._execution_engine.queue_callback(self._end_task)

    def _end_task(self) -> None:
        _, interrupted = self._tasks.pop()
        if self._tasks:
            self.task = self._tasks[-1][0]
            self.bw_path = interrupted
        else:
            # FSDP2's final callback (queued after ours) reduce-scatters the root's gradients
            self.bw_path = self._root_path
        self._on_move()

    def backward_of(self, mod: torch.nn.Module) -> tuple[str, ...]:
        """Put the backward location on ``mod`` (work done for it when its backward is over);
        returns the location it replaced, for :meth:`restore_backward`."""
        previous = self.bw_path
        if _graph_task_id() != -1:
            if _graph_task_id() != self.task:
                self.begin_task()
                previous = self.bw_path
            self.bw_path = self.path_of(mod)
            self._on_move()
        self._pinned += 1
        return previous

    def restore_backward(self, path: tuple[str, ...]) -> None:
        self._pinned = max(0, self._pinned - 1)
        if self.bw_path is not path:
            self.bw_path = path
            self._on_move()

    # ---- optimizer --------------------------------------------------------------------------

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_depth += 1
        self.fw_phase = OPTIMIZER
        self._on_move()

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_depth = max(0, self._optimizer_depth - 1)
        if self._optimizer_depth == 0:
            self.fw_phase = FORWARD
            self._on_move()
            self._on_optimizer_step()

    # ---- context ----------------------------------------------------------------------------

    def __enter__(self) -> ModuleTracker:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.stack.clear()
        self.paths.clear()
        self._calls.clear()
        self.bw_path = (GLOBAL,)
        self.fw_phase = FORWARD
        self._optimizer_depth = 0
        # optimizer hooks stay while paused: steps are still counted
        self._optimizer_handles = [
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
        ]
        # compiled code runs without our global hook, also while paused: see track_compiled
        MODULE_COMPILE.add(self)
        OPTIMIZED_CALL.add(self)
        self.resume()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pause()
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None
        for handle in self._handles + self._optimizer_handles:
            handle.remove()
        self._handles = []
        self._optimizer_handles = []
        for ref, wrapper in self._compiled:
            mod = ref()
            if mod is not None and mod.__dict__.get("_compiled_call_impl") is wrapper:
                mod._compiled_call_impl = wrapper.call
        self._compiled = []
        MODULE_COMPILE.remove(self)
        OPTIMIZED_CALL.remove(self)
        self._hooked = weakref.WeakKeyDictionary()
        self._known.clear()
        self._param_owners.clear()
        self._ranges = NodeRanges()
        self._pinned = 0
        self.stack.clear()
        self.paths.clear()
        self._calls.clear()
        self.fw_phase = FORWARD

    def pause(self) -> None:
        """Stop tracking modules, keeping what is known: modules' own hooks return at once
        while paused, the global one only counts calls, optimizer steps are still seen."""
        if self.active and self.calls:
            MODULE_CALL.remove(self)
        self.active = False
        for patch in FSDP_PATCHES:
            patch.remove(self)
        if self._pre_handle is not None:
            self._pre_handle.remove()
        self._pre_handle = register_module_forward_pre_hook(self._count_forward)

    def resume(self) -> None:
        if self.active:
            return
        self.active = True
        for patch in FSDP_PATCHES:
            patch.add(self)
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None
        if self.calls:
            MODULE_CALL.add(self)
        else:
            self._pre_handle = register_module_forward_pre_hook(self._pre_hook)

    def _count_forward(self, mod: torch.nn.Module, args: tuple) -> None:
        if not _compiling():
            self.forwards += 1
