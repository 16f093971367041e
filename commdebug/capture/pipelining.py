"""Which schedule step a pipelining send or recv belongs to.

``torch.distributed.pipelining`` sends activations and gradients outside any module and, for
gradients, after ``backward`` has returned, so neither module hooks nor "is autograd running"
can tell a gradient send from an activation send. The stage knows: its ``get_fwd_*_ops`` and
``get_bwd_*_ops`` build the P2P ops of one microbatch. While a :class:`PipelineTags` is active
those four methods are wrapped to remember, per tensor they return, the phase, the stage's
module and the microbatch; the dispatch mode looks the tensor up when the send or recv runs.

The wrappers are installed only while a recording is active, and only once the program has
imported pipelining (:class:`~commdebug.capture.patches.ClassPatch`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from commdebug.capture.patches import ClassPatch

__all__ = ["PipelineTag", "PipelineTags", "first_tensor"]

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

    def __enter__(self) -> PipelineTags:
        _STAGE.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _STAGE.remove(self)
        self._tags.clear()


def _wrapper(phase: str) -> Any:
    def make(original: Any, patch: ClassPatch) -> Any:
        def build_ops(stage: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = original(stage, chunk_id, *args, **kwargs)
            tag = PipelineTag(phase, getattr(stage, "submod", None), chunk_id)
            for tags in patch.users:
                tags._record(ops, tag)
            return ops

        return build_ops

    return make


_STAGE = ClassPatch("torch.distributed.pipelining.stage", "_PipelineStageBase",
                    {name: _wrapper(phase) for name, phase in _METHODS.items()})


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor of a send/recv's tensor or list of tensors (what the tags are keyed by)."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, torch.Tensor) else None
