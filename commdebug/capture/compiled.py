"""Recording a ``torch.compile``'d program without changing what runs (docs/compile.md).

Dynamo guards a compiled ``_call_impl`` on torch's table of global module hooks, and traces the
hooks of a ``mod.compile()``'d module into its graph. The tracker's hooks return at once while
Dynamo traces (:func:`compiling`); its global hook is hidden from compiled code while that runs,
and its hooks run around the compiled call instead:

- :class:`CompiledCall` replaces a ``mod.compile()``'d module's ``_compiled_call_impl``;
- ``OPTIMIZED_CALL`` wraps the call of ``torch.compile(mod)``'s wrapper module, whose own hooks
  run eagerly and whose ``forward`` is compiled;
- ``MODULE_COMPILE`` tracks a module compiled while recording at once.

The tracker is passed in (``tracker._pre_hook``, ``global_hook_hidden``...): this module does
not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from commdebug.capture.calls import nested_call
from commdebug.capture.patches import ClassPatch

__all__ = ["CompiledCall", "MODULE_COMPILE", "OPTIMIZED_CALL", "compiling"]

compiling = torch.compiler.is_compiling


class CompiledCall:
    """A ``mod.compile()``'d module's call: the tracker's forward hooks around it, its global
    hook hidden while it runs."""

    __slots__ = ("call", "tracker", "module")

    def __init__(self, call: Callable, tracker: Any, module: torch.nn.Module) -> None:
        self.call = call
        self.tracker = tracker
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tracker, mod = self.tracker, self.module
        if compiling():  # an outer compiled region traces through us
            return self.call(*args, **kwargs)
        track = tracker.active and not tracker.calls  # a light step's call wrapper tracked it
        if track:
            tracker._pre_hook(mod, args)
        with tracker.global_hook_hidden():
            out = self.call(*args, **kwargs)
        if track:
            fqn, parent_module = tracker._hooked[mod]
            tracker._post_hook_for(fqn, parent_module)(mod, args, kwargs, out)
        return out


def _optimized_call(original: Any, patch: ClassPatch) -> Any:
    """``torch.compile(mod)``'s wrapper module: its call runs its own hooks eagerly, then the
    compiled code, which must not see our global hooks (see ``track_compiled``): they are
    hidden, and our pre-hook is called here instead (a post-hook of ours is on the wrapper)."""

    def __call__(opt: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(opt, *args, **kwargs)
        for tracker in patch.users:
            if tracker.active and not tracker.calls:
                tracker._pre_hook(opt, args)

        def run(opt: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            with ExitStack() as hidden:
                for tracker in patch.users:
                    hidden.enter_context(tracker.global_hook_hidden())
                return original(opt, *args, **kwargs)

        # light steps: the wrapper module is on the stack while it runs, as Module.__call__ does
        return nested_call([t for t in patch.users if t.active and t.calls], run, opt, args, kwargs)

    return __call__


def _compile(original: Any, patch: ClassPatch) -> Any:
    """A module compiled while recording is tracked at once (one compiled before is found when
    its parent first runs)."""

    def compile(mod: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = original(mod, *args, **kwargs)
        for tracker in patch.users:
            tracker.track_compiled(mod)
        return result

    return compile


MODULE_COMPILE = ClassPatch("torch.nn.modules.module", "Module", {"compile": _compile})
OPTIMIZED_CALL = ClassPatch("torch._dynamo.eval_frame", "OptimizedModule", {"__call__": _optimized_call})
