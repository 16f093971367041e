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

from commdebug.capture import unseen

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
    every mode's (``TorchDispatchMode._should_skip_dynamo``), at a fraction of what torch's
    wrapper costs. Until Dynamo is loaded nothing can trace it, so it runs as it is (torch's
    wrapper would import Dynamo at the first op). Once loaded, Dynamo traces a frame only while
    its frame callback is set on this thread (inside code that ``torch.compile`` runs): then the
    call goes through ``torch._dynamo.disable``, which clears the callback for it. Anywhere
    else that wrapper would clear a callback that is not set, and it costs 5% of a
    tensor-parallel step under the full capture (two ``set_eval_frame`` calls and two Python
    frames for each of the step's ops), so the call goes straight to ``fn``. An error torch
    raised in a collective the mode ran leaves without the mode's frames
    (:mod:`commdebug.capture.unseen`)."""
    disabled: list[Callable[..., Any] | None] = [None]
    callback: list[Callable[[], Any] | None] = [None]

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        try:
            call = disabled[0]
            if call is None:
                dynamo = sys.modules.get("torch._dynamo")
                if dynamo is None:
                    return fn(*args, **kwargs)
                call = disabled[0] = dynamo.disable(fn, recursive=True, wrapping=False)
                callback[0] = _callback_getter()
            get = callback[0]
            if get is not None and get() is None:
                return fn(*args, **kwargs)
            return call(*args, **kwargs)
        except BaseException as e:
            unseen.strip(e, below=True)  # an error torch raised in an op: the program's traceback is its own
            raise

    return inner


def _callback_getter() -> Callable[[], Any] | None:
    """The C function that reads this thread's Dynamo frame callback (None: no tracing here), or
    None where this torch has none (then every call takes the disabling wrapper)."""
    eval_frame = sys.modules.get("torch._C._dynamo.eval_frame")
    return getattr(eval_frame, "get_eval_frame_callback", None)
