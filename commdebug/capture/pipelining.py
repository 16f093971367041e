"""Which schedule step a pipelining send or recv belongs to.

``torch.distributed.pipelining`` sends activations and gradients outside any module and, for
gradients, after ``backward`` has returned, so neither module hooks nor "is autograd running"
can tell a gradient send from an activation send. The stage knows: its ``get_fwd_*_ops`` and
``get_bwd_*_ops`` build the P2P ops of one microbatch. While a :class:`PipelineTags` is active
those four methods are wrapped to remember, per tensor they return, the phase, the stage's
module and the microbatch; the dispatch mode looks the tensor up when the send or recv runs.

Nothing is imported or patched unless the program uses pipelining: if it has not imported it
yet when the context is entered (``commdebug run`` enters before the program starts), a finder
on ``sys.meta_path`` wraps the stage class the moment the program imports it. (Importing it
ourselves would cost every program over a second.)
"""

from __future__ import annotations

import importlib.machinery
import sys
from typing import Any, NamedTuple

__all__ = ["PipelineTag", "PipelineTags"]

_METHODS = {
    "get_fwd_recv_ops": "forward",
    "get_fwd_send_ops": "forward",
    "get_bwd_recv_ops": "backward",
    "get_bwd_send_ops": "backward",
}


class PipelineTag(NamedTuple):
    phase: str
    module: Any  # the stage's submodule
    microbatch: int


class PipelineTags:
    """Context manager: tag the P2P ops pipelining stages build while it is active.

    Nested instances share one set of wrappers (installed by the outermost, removed when the
    last one exits); each keeps its own tags.
    """

    _active: list["PipelineTags"] = []
    _originals: dict[str, Any] = {}

    def __init__(self) -> None:
        # id(tensor) -> (tensor, tag); the tensor is held so its id is not reused meanwhile
        self._tags: dict[int, tuple[Any, PipelineTag]] = {}

    def pop(self, tensor: Any) -> PipelineTag | None:
        """The tag of a tensor about to be sent or received, forgotten once read."""
        if not self._tags:
            return None
        entry = self._tags.pop(id(tensor), None)
        return None if entry is None or entry[0] is not tensor else entry[1]

    def _record(self, ops: Any, tag: PipelineTag) -> None:
        for op in ops or ():
            tensor = getattr(op, "tensor", None)
            if tensor is not None:
                self._tags[id(tensor)] = (tensor, tag)

    def __enter__(self) -> "PipelineTags":
        PipelineTags._active.append(self)
        if len(PipelineTags._active) == 1:
            if _stage_class() is not None:
                _install()
            elif not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _WrapOnImport())
        return self

    def __exit__(self, *exc: object) -> None:
        if self in PipelineTags._active:
            PipelineTags._active.remove(self)
        if not PipelineTags._active and PipelineTags._originals:
            cls = _stage_class()
            for name, original in PipelineTags._originals.items():
                setattr(cls, name, original)
            PipelineTags._originals.clear()
        self._tags.clear()


def _install() -> None:
    cls = _stage_class()
    if cls is None or PipelineTags._originals:
        return
    for name, phase in _METHODS.items():
        original = getattr(cls, name, None)
        if original is not None:
            PipelineTags._originals[name] = original
            setattr(cls, name, _wrapped(original, phase))


class _WrapOnImport:
    """A meta-path finder that lets the stage module import as usual, then wraps its class if a
    context is still active; it removes itself once the module is loaded."""

    _MODULE = "torch.distributed.pipelining.stage"

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self._MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if PipelineTags._active:
                _install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _stage_class() -> Any:
    module = sys.modules.get("torch.distributed.pipelining.stage")
    return getattr(module, "_PipelineStageBase", None)


def _wrapped(original: Any, phase: str) -> Any:
    def build_ops(stage: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        ops = original(stage, chunk_id, *args, **kwargs)
        tag = PipelineTag(phase, getattr(stage, "submod", None), chunk_id)
        for tags in PipelineTags._active:
            tags._record(ops, tag)
        return ops

    build_ops.__wrapped__ = original  # type: ignore[attr-defined]
    return build_ops
