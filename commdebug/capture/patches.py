"""Wrapping a few methods of a torch class while a recording is active.

Some facts about a collective are known only inside torch's parallelism libraries: which
microbatch a pipeline send carries, which FSDP2 module a post-backward reduce-scatter belongs
to. A :class:`ClassPatch` wraps the methods that know, while at least one user (a recording)
is active, and puts the originals back when the last one leaves.

Nothing is imported to do so: importing ``torch.distributed.pipelining`` or FSDP ourselves
would cost every program a second or more. If the program has not imported the class's module
yet when a recording starts (``commdebug run`` starts before the program), a finder on
``sys.meta_path`` wraps the class the moment the program imports it.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ClassPatch"]


class ClassPatch:
    """Wrap ``module.cls_name``'s methods while :attr:`users` is not empty.

    ``wrappers`` maps a method name to a factory ``(original, patch) -> wrapped``; the wrapped
    method reads ``patch.users`` to find who is recording.

    >>> patch = ClassPatch("torch.distributed.pipelining.stage", "_PipelineStageBase",
    ...                    {"get_fwd_send_ops": make_wrapper})   # doctest: +SKIP
    >>> patch.add(recording); ...; patch.remove(recording)        # doctest: +SKIP
    """

    def __init__(self, module: str, cls_name: str, wrappers: dict[str, Callable[[Any, ClassPatch], Any]]) -> None:
        self.module = module
        self.cls_name = cls_name
        self.wrappers = wrappers
        self.users: list[Any] = []
        self._originals: dict[str, Any] = {}

    def cls(self) -> Any:
        return getattr(sys.modules.get(self.module), self.cls_name, None)

    def add(self, user: Any) -> None:
        self.users.append(user)
        if len(self.users) > 1:
            return
        if self.cls() is not None:
            self._install()
        elif not any(isinstance(f, _WrapOnImport) and f.patch is self for f in sys.meta_path):
            sys.meta_path.insert(0, _WrapOnImport(self))

    def remove(self, user: Any) -> None:
        if user in self.users:
            self.users.remove(user)
        if not self.users and self._originals:
            cls = self.cls()
            for name, original in self._originals.items():
                setattr(cls, name, original)
            self._originals.clear()

    def _install(self) -> None:
        cls = self.cls()
        if cls is None or self._originals:
            return
        for name, make in self.wrappers.items():
            original = getattr(cls, name, None)
            if original is not None:
                self._originals[name] = original
                wrapped = make(original, self)
                wrapped.__wrapped__ = original
                setattr(cls, name, wrapped)


class _WrapOnImport:
    """A meta-path finder that lets the module import as usual, then wraps its class if a
    recording is still active; it removes itself once the module is loaded."""

    def __init__(self, patch: ClassPatch) -> None:
        self.patch = patch

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.patch.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if self.patch.users:
                self.patch._install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this loader only: patch once its module ran
        return spec
