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

try:
    from commdebug.capture._frames import first_other as _first_other
except ImportError:  # not built (no C compiler at install time) or not this Python: frame objects
    _first_other = None

__all__ = ["caller", "in_compiled_code"]

# DTensor lowers an op to collectives inside this file; a collective with it on the stack came
# from the DTensor op seen last.
_DTENSOR_DISPATCH = os.path.join(os.path.dirname(torch.__file__), "distributed", "tensor", "_dispatch.py")
# what a frame is: the user's code, DTensor's dispatch, compiled code, or other (library)
_USER, _DTENSOR, _LIBRARY, _COMPILED = "user", "dtensor", "library", "compiled"
# A real file's frames are all of one kind, looked up by file name (a string caches its hash).
# Generated code ("<string>", "<eval_with_key>.3") shares made-up names: each code object is
# classified apart, keyed by id (hashing a code object hashes its bytecode), and _CODES keeps it
# alive so that no other object takes its id.
_KIND_BY_FILE: dict[str, str] = {}
_LIBRARY_FILES: set[str] = set()  # the files of _KIND_BY_FILE that are _LIBRARY: the walk's inner loop
_KIND_BY_CODE: dict[int, str] = {}
_CODES: list[Any] = []
_SITES: dict[tuple[int, int], str] = {}  # (id of a user's code, instruction) -> "file:line"
_SITE_CODES: dict[int, Any] = {}  # the codes _SITES names, kept alive while it does
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


def _kind(frame: Any) -> str:
    """What ``frame`` is, classified once per file (or per generated code object)."""
    code = frame.f_code
    if code.co_filename.startswith("<") and not code.co_filename.startswith("<frozen"):
        kind = _KIND_BY_CODE.get(id(code))
        if kind is None:
            kind = _KIND_BY_CODE[id(code)] = _frame_kind(frame)
            _CODES.append(code)
        return kind
    kind = _KIND_BY_FILE[code.co_filename] = _frame_kind(frame)
    if kind is _LIBRARY:
        _LIBRARY_FILES.add(code.co_filename)
    return kind


def caller(depth: int = 1) -> tuple[str | None, bool, bool]:
    """(``file:line`` of the first frame of the user's code above the frame `depth` levels up
    from the caller, whether DTensor dispatch is on the way there, whether compiled code is)."""
    if _first_other is None:
        return _walk_frames(depth + 1)
    depth += 1
    from_dtensor = compiled = False
    library = _LIBRARY_FILES
    while True:
        # the library's frames, most of the walk (some twenty per collective), skipped in C,
        # which reads the interpreter's frames without making a frame object of each
        found = _first_other(depth, library)
        if found is None:  # the bottom of the stack: no user frame
            return None, from_dtensor, compiled
        code, instruction, depth = found
        # a file seen for the first time, or generated code (classified per code object)
        kind = _KIND_BY_FILE.get(code.co_filename) or _kind(sys._getframe(depth))
        if kind is _USER:
            site = (id(code), instruction)
            text = _SITES.get(site)
            return (text or _site(site, sys._getframe(depth))), from_dtensor, compiled
        if kind is _DTENSOR:
            from_dtensor = True
        elif kind is _COMPILED:
            compiled = True
        depth += 1


def _walk_frames(depth: int) -> tuple[str | None, bool, bool]:
    """:func:`caller` by frame objects, where :mod:`commdebug.capture._frames` is not built."""
    frame = sys._getframe(depth + 1)
    from_dtensor = compiled = False
    library = _LIBRARY_FILES
    try:
        while True:
            while frame.f_code.co_filename in library:
                frame = frame.f_back
            kind = _KIND_BY_FILE.get(frame.f_code.co_filename) or _kind(frame)
            if kind is _USER:
                site = (id(frame.f_code), frame.f_lasti)
                return (_SITES.get(site) or _site(site, frame)), from_dtensor, compiled
            if kind is _DTENSOR:
                from_dtensor = True
            elif kind is _COMPILED:
                compiled = True
            frame = frame.f_back
    except AttributeError:  # the bottom of the stack (None has no f_code): no user frame
        return None, from_dtensor, compiled


def _site(site: tuple[int, int], frame: Any) -> str:
    """``file:line`` of a call site seen for the first time (f_lineno decodes the line table)."""
    if len(_SITES) > 100_000:
        _SITES.clear()
        _SITE_CODES.clear()
    text = _SITES[site] = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    _SITE_CODES[site[0]] = frame.f_code
    return text


def in_compiled_code(depth: int = 1) -> bool:
    """Whether compiled code (see :func:`caller`) is on the stack below the user's code."""
    return caller(depth + 1)[2]
