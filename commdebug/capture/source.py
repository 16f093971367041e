"""Where a collective came from: the first frame of the user's code on the stack, whether
DTensor's dispatch lowered it (then it belongs to the DTensor op seen last), and whether
compiled code issued it (``torch.compile``: a module Inductor's code cache loaded, an FX graph,
or AOTAutograd's runtime, which also runs a compiled backward).

Compiled code is known by where it comes from, never by its path: Inductor writes its code
wherever ``TORCHINDUCTOR_CACHE_DIR`` says. A compiled collective's line is the user's line that
called the compiled function, as eager names the user's line: the frame that runs Dynamo's
transformed code of the function, whose line there is the function's ``def``, is passed over
(an eager call at a graph break keeps that frame's line, which is the call's own).

Frames are classified once per file (or generated code object): the walk runs for every
collective.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch

from commdebug.sourcefiles import NOT_USER_DIRS, NOT_USER_MODULES

_first_other: Callable[[int, set[str]], tuple[CodeType, int, int] | None] | None
try:
    from commdebug.capture._frames import first_other as _first_other
except ImportError:  # not built (no C compiler at install time) or not this Python: frame objects
    _first_other = None

__all__ = ["caller", "in_compiled_code", "native_view"]

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
# ids of the codes in _SITES that Dynamo made of a compiled function (see _site)
_DYNAMO_CODES: set[int] = set()
# what runs a compiled graph: AOTAutograd's runtime (forward and backward), a module Inductor
# generated (see _inductor_generated), an FX graph's generated code
_AOT_RUNTIME = os.path.join(os.path.dirname(torch.__file__), "_functorch", "_aot_autograd") + os.sep
# the name Inductor's loader (runtime.compile_tasks._reload_python_module) gives each module its
# code cache loads, followed by the module's key
_INDUCTOR_LOADED = "torch._inductor.runtime.compile_tasks."


def _inductor_generated(frame: Any) -> bool:
    """Whether ``frame`` runs a module Inductor generated, wherever its cache folder is: one
    that its code cache (``PyCodeCache``) loaded, or that its loader named (``fresh_cache`` and
    ``cache_clear`` empty the code cache while what it loaded may still run)."""
    if str(frame.f_globals.get("__name__")).startswith(_INDUCTOR_LOADED):
        return True
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None:  # Inductor never loaded: nothing it generated runs
        return False
    filename, cache = frame.f_code.co_filename, codecache.PyCodeCache
    return filename in cache.modules_no_attr or any(getattr(m, "__file__", None) == filename for m in cache.modules)


def _dynamo_code(code: Any) -> bool:
    """Whether ``code`` is what Dynamo made of a compiled function: it calls the compiled graph
    from the function's ``def`` line, and what runs eagerly at a graph break from its own line."""
    utils = sys.modules.get("torch._dynamo.utils")  # not loaded: nothing was compiled
    return utils is not None and code in utils.orig_code_map


def _frame_kind(frame: Any) -> str:
    filename = frame.f_code.co_filename
    if filename == _DTENSOR_DISPATCH:
        return _DTENSOR
    if filename.startswith((_AOT_RUNTIME, "<eval_with_key>")):
        return _COMPILED
    if filename.startswith(NOT_USER_DIRS) or filename.startswith("<frozen") or frame.f_globals.get("__name__") in NOT_USER_MODULES:
        return _LIBRARY
    # after the library's files, which are most of the files met, so that only the others pay
    # for looking through the code cache (Inductor's code also always runs under AOTAutograd's
    # runtime, which marks it compiled even from a cache folder inside the library's)
    return _COMPILED if _inductor_generated(frame) else _USER


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


def native_view() -> tuple | None:
    """What light capture's C++ kernel reads to find a collective's line as :func:`caller` does,
    where every frame on the way is classified and the line named already (commdebug/capture/
    _native.cpp's known_source, which hands every other case to ``caller``): the C walker, the
    library's files, the kinds by file, the named sites and the kinds it tells apart. None
    where the walker is not built."""
    if _first_other is None:
        return None
    return (_first_other, _LIBRARY_FILES, _KIND_BY_FILE, _SITES, _USER, _DTENSOR)


def caller(depth: int = 1) -> tuple[str | None, bool, bool]:
    """(``file:line`` of the first frame of the user's code above the frame `depth` levels up
    from the caller, passing over a compiled function's own frame above its compiled code,
    whether DTensor dispatch is on the way there, whether compiled code is)."""
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
            text = _SITES.get(site) or _site(site, sys._getframe(depth))
            # the compiled function's own frame (its def line), below the compiled code it ran:
            # its caller's line is the user's, as in eager
            if not (compiled and site[0] in _DYNAMO_CODES):
                return text, from_dtensor, compiled
        if kind is _DTENSOR:
            from_dtensor = True
        elif kind is _COMPILED:
            compiled = True
        depth += 1


def _walk_frames(depth: int) -> tuple[str | None, bool, bool]:
    """:func:`caller` by frame objects, where :mod:`commdebug.capture._frames` is not built."""
    frame: FrameType | None = sys._getframe(depth + 1)
    from_dtensor = compiled = False
    library = _LIBRARY_FILES
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in library:
            frame = frame.f_back
            continue
        kind = _KIND_BY_FILE.get(filename) or _kind(frame)
        if kind is _USER:
            site = (id(frame.f_code), frame.f_lasti)
            text = _SITES.get(site) or _site(site, frame)
            if not (compiled and site[0] in _DYNAMO_CODES):  # as in caller
                return text, from_dtensor, compiled
        if kind is _DTENSOR:
            from_dtensor = True
        elif kind is _COMPILED:
            compiled = True
        frame = frame.f_back
    return None, from_dtensor, compiled  # the bottom of the stack: no user frame


def _site(site: tuple[int, int], frame: Any) -> str:
    """``file:line`` of a call site seen for the first time (f_lineno decodes the line table);
    its code goes to _DYNAMO_CODES if Dynamo made it (the user's file holds both kinds)."""
    if len(_SITES) > 100_000:
        _SITES.clear()
        _SITE_CODES.clear()
        _DYNAMO_CODES.clear()
    code = frame.f_code
    text = _SITES[site] = f"{code.co_filename}:{frame.f_lineno}"
    _SITE_CODES[site[0]] = code
    if _dynamo_code(code):
        _DYNAMO_CODES.add(site[0])
    return text


def in_compiled_code(depth: int = 1) -> bool:
    """Whether compiled code (see :func:`caller`) is on the stack below the user's code."""
    return caller(depth + 1)[2]
