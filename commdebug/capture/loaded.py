"""The torch modules the recorder needs only once the program itself has loaded them.

Importing ``torch.distributed.tensor`` (DTensor), and Dynamo with it, costs a recorded process
about a second of CPU at start-up, most of a small job's recording overhead; a program that never
imported them has no DTensor to look at and no compiler that could trace the recorder. So both
are looked up in ``sys.modules`` when needed, never imported here.

    >>> dtensor() is None or isinstance(x, dtensor())          # doctest: +SKIP
    >>> Mode.__torch_dispatch__ = skip_dynamo_lazily(Mode.__dict__["__torch_dispatch__"])  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["dtensor", "skip_dynamo_lazily"]

_DTENSOR: list[Any] = [None]


def dtensor() -> Any:
    """DTensor's class once the program has imported it, else None (no DTensor exists yet)."""
    found = _DTENSOR[0]
    if found is None:
        found = _DTENSOR[0] = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return found


def skip_dynamo_lazily(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a dispatch mode's ``__torch_dispatch__``) never traced by Dynamo, as torch makes
    every mode's (``TorchDispatchMode._should_skip_dynamo``), without importing Dynamo at the
    first op as torch's wrapper does: until Dynamo is loaded nothing can trace it, so it runs as
    it is; from then on through ``torch._dynamo.disable``."""
    disabled: list[Callable[..., Any] | None] = [None]

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        call = disabled[0]
        if call is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None:
                return fn(*args, **kwargs)
            call = disabled[0] = dynamo.disable(fn, recursive=True, wrapping=False)
        return call(*args, **kwargs)

    return inner
