"""Where a collective came from: the first frame of the user's code on the stack, whether
DTensor's dispatch lowered it (then it belongs to the DTensor op seen last), and whether
compiled code issued it (``torch.compile``: Inductor's generated module, an FX graph, or
AOTAutograd's runtime, which also runs a compiled backward).

Frames are classified once per code object: the walk runs for every collective.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from commdebug.sourcefiles import NOT_USER_DIRS, NOT_USER_MODULES

__all__ = ["caller", "in_compiled_code"]

# DTensor lowers an op to collectives inside this file; a collective with it on the stack came
# from the DTensor op seen last.
_DTENSOR_DISPATCH = os.path.join(os.path.dirname(torch.__file__), "distributed", "tensor", "_dispatch.py")
# code object -> what its frames are: the user's code, DTensor's dispatch, or other (library)
_USER, _DTENSOR, _LIBRARY, _COMPILED = "user", "dtensor", "library", "compiled"
# keyed by id: hashing a code object hashes its bytecode and constants, for every frame walked
# (the entry keeps the code alive, so its id is not reused while the entry stands)
_FRAME_KIND: dict[int, tuple[Any, str]] = {}
_SITES: dict[tuple[int, int], str] = {}  # (id of a user's code, instruction) -> "file:line"
# what runs a compiled graph: AOTAutograd's runtime (forward and backward), the module Inductor
# generates (under its cache directory, "torchinductor_<user>"), an FX graph's generated code
_AOT_RUNTIME = os.path.join(os.path.dirname(torch.__file__), "_functorch", "_aot_autograd") + os.sep


def _frame_kind(frame: Any) -> str:
    filename = frame.f_code.co_filename
    if filename == _DTENSOR_DISPATCH:
        return _DTENSOR
    if filename.startswith(_AOT_RUNTIME) or filename.startswith("<eval_with_key>") or "torchinductor" in filename:
        return _COMPILED
    if filename.startswith(NOT_USER_DIRS) or filename.startswith("<frozen") or frame.f_globals.get("__name__") in NOT_USER_MODULES:
        return _LIBRARY
    return _USER


def caller(depth: int = 1) -> tuple[str | None, bool, bool]:
    """(``file:line`` of the first frame of the user's code above the frame `depth` levels up
    from the caller, whether DTensor dispatch is on the way there, whether compiled code is)."""
    frame = sys._getframe(depth + 1)
    from_dtensor = compiled = False
    kind_of = _FRAME_KIND.get
    while frame is not None:
        code = frame.f_code
        known = kind_of(id(code))
        if known is not None and known[0] is code:
            kind = known[1]
        else:
            kind = _frame_kind(frame)
            _FRAME_KIND[id(code)] = (code, kind)
        if kind is _USER:
            # f_lineno decodes the line table: once per call site
            site = (id(code), frame.f_lasti)
            text = _SITES.get(site)
            if text is None:
                if len(_SITES) > 100_000:
                    _SITES.clear()
                text = _SITES[site] = f"{code.co_filename}:{frame.f_lineno}"
            return text, from_dtensor, compiled
        if kind is _DTENSOR:
            from_dtensor = True
        elif kind is _COMPILED:
            compiled = True
        frame = frame.f_back
    return None, from_dtensor, compiled


def in_compiled_code(depth: int = 1) -> bool:
    """Whether compiled code (see :func:`caller`) is on the stack below the user's code."""
    return caller(depth + 1)[2]
