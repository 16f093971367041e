"""Light capture: every collective, without a TorchDispatchMode on the stack.

A dispatch mode sees every aten op of the program, which is what costs. Light capture instead
registers a Python kernel for the collective ops alone (every op of ``commdebug/ops.py`` that
this torch has, and the functional collectives' wait). The kernel records the call, then
redispatches to the keys below its own:

- functional collectives, their waits, DTensor's and symmetric memory's ops: at
  ``BackendSelect``, which is in every call's key set (under inference mode and below autograd
  too) just above the backend. That covers DTensor's redistributions, also those inside a
  DTensor op's own dispatch (the Partial gradients an optimizer's ``add_`` reduces), their
  backward collectives and the autograd-aware variants (seen as the functional op they run);
- eager c10d ops (``torch.distributed.all_reduce`` & co., send/recv, barrier, FSDP2's
  all-gathers and reduce-scatters, DDP's reducer from C++): at the autograd keys. A functional
  collective's implementation issues its c10d op through the dispatcher below autograd (its
  autograd kernel, or the autograd fallback, excludes the autograd keys), so that nested call
  passes no second Python kernel. Inference mode excludes them too: while
  a ``torch.inference_mode()`` block is open, the eager ops also get a kernel at
  ``BackendSelect`` (``INFERENCE_MODE``).

A collective issued while one is being recorded on the same thread is only redispatched. Meta
tensors (tracing under ``torch.compile``) are never recorded.

The kernel is C++ where :mod:`commdebug.capture._native` is built (see _native.cpp). While the
innermost recording is plain (no ``ops`` filter, no timing, no NVTX ranges) it records most
calls itself: the same event, from facts the Python path worked out on the op's first call on
its group (:func:`_plain_entry` says which ops; ``Recorder._native_state`` what it reads).
Every other call it hands to Python once, with the tensors and plain values the recorder reads
and the group by name, and runs the op itself. Where it is not built (no compiler, or no torch
to build against, at install) the kernels are Python ones, and that is said once: each pass
through a Python kernel costs microseconds of boxing, so light capture keeps their number down:

- Functional collectives whose autograd kernel torch wrote in Python are recorded where that
  kernel redispatches below autograd, and skip our kernel (:func:`_redispatch`); with the C++
  kernel, only those it would hand to Python anyway.
- A DTensor's waits go through ``AsyncCollectiveTensor.trigger_wait``, which is wrapped anyway
  (:mod:`commdebug.capture.inflight`) and finishes the collective itself: the ``wait_tensor``
  inside it skips our key. (c10d's registry of unwaited functional collectives cannot stand in
  for the wait kernel: a wait takes its Work out of the registry before it blocks, so a rank
  hung in ``wait_tensor`` would read finished.)
- The kernels exist only while a light recording is active: the first one to start registers
  them, the last one to end removes them, so a program outside a recording pays nothing.

Limits: a collective that bypasses the dispatcher (inside a compiled graph's own kernels) is not
seen, nor an eager c10d op issued from inside another op's kernel below autograd (a custom op
calling ``dist.all_reduce``), nor one on an inference tensor once its inference-mode block has
closed. The DTensor op behind a collective and the per-module op rows need the dispatch mode,
which ``detail_every`` pushes for some steps. Modules are tracked without hooks
(:mod:`commdebug.capture.calls`).
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from types import ModuleType
from typing import Any

import torch

from commdebug import ops as _ops
from commdebug.capture import unseen
from commdebug.capture.patches import ClassPatch
from commdebug.capture.stepping import say_once

_native: ModuleType | None
try:
    from commdebug.capture import _native
except ImportError:  # not built: Python kernels
    _native = None

__all__ = ["attach", "detach", "installed", "skip", "unskip", "KEY"]

KEY = "BackendSelect"
# eager c10d ops: the autograd keys, which the functional collectives' own dispatch leaves
# (see _install); under inference mode, BackendSelect as the rest
EAGER_KEY = "Autograd"
# the keys the kernels redispatch to: whatever lies below theirs
_BELOW = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
_BELOW_AUTOGRAD = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.AutogradOther)
_EAGER_NAMESPACE = "c10d"
_dispatch_keys = torch._C._dispatch_keys
_OURS = torch._C.DispatchKeySet(torch._C.DispatchKey.BackendSelect)
_BACKEND_SELECT = torch._C.DispatchKey.BackendSelect
_is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_set_excluded = torch._C._dispatch_tls_set_dispatch_key_excluded
_META = torch._C.DispatchKey.Meta

# the light recordings active now, innermost last; the kernels report to the innermost
_ACTIVE: list[Any] = []
_LOCK = threading.Lock()
_LIBRARIES: dict[str, Any] = {}  # namespace -> torch.library.Library holding our kernels
_INFERENCE: list[Any] = []  # the eager ops' BackendSelect kernels, while inference mode is on
_REDISPATCHING: list[Any] = []  # functional collectives given our redispatch (_redispatch)
_inference_depth = 0


class _State(threading.local):
    inside = False  # a collective is being recorded on this thread (a class default: read without a miss)


_STATE = _State()

# how the recorder makes an event: tuple.__new__, and where the C++ extension is built, not
# tracked by the garbage collector (an event can be in no reference cycle: see _native.cpp)
new_event: Callable[[type, tuple], Any] = getattr(_native, "new_event", None) or tuple.__new__
_NATIVE_OPS: list[tuple[str, Any]] = []  # the C++ kernels' index -> (op name, spec)
_NATIVE_INDEX: dict[str, int] = {}  # op name -> its index there
_PLAIN_ENTRIES: list[Any] = []  # by that index: what the C++ kernel records itself (_plain_entry)


def attach(recorder: Any) -> None:
    """Start sending collectives to ``recorder._light_call`` (registers the kernels if no light
    recording is active)."""
    with _LOCK:
        if not _LIBRARIES:
            _install()
        _ACTIVE.append(recorder)
        _innermost_to_native()


def detach(recorder: Any) -> None:
    """Stop sending collectives to ``recorder``; the last one out removes the kernels."""
    with _LOCK:
        if recorder in _ACTIVE:
            _ACTIVE.remove(recorder)
        _innermost_to_native()
        if not _ACTIVE:
            if _native is not None:
                _native.set_handler(None)
            _destroy([*_LIBRARIES.values(), *_INFERENCE])
            for op in _REDISPATCHING:
                op.__dict__.pop("redispatch", None)
            _REDISPATCHING.clear()
            _LIBRARIES.clear()
            _INFERENCE.clear()
            INFERENCE_MODE.remove(_INFERENCE_USER)


def _innermost_to_native() -> None:
    """Hand the C++ kernel the innermost recording's plain path (see Recorder._native_state)."""
    if _native is not None:
        _native.set_recorder(_ACTIVE[-1]._native_state() if _ACTIVE else None)


def installed() -> bool:
    """Whether the kernels are registered now (only while a light recording is active)."""
    return bool(_LIBRARIES)


def _skip() -> bool | None:
    """Let calls on this thread go past the kernels until :func:`unskip`, for a call whose
    collectives need no recording (its arguments must hold a tensor: dispatch then needs no
    ``BackendSelect`` to find the backend). Returns what ``unskip`` needs: None when no kernel
    is registered. This runs for every wait of a DTensor program: where the C++ extension is
    built, ``skip`` and ``unskip`` are C (``_native``), which spares each wait two Python frames.

    >>> token = skip()
    >>> try:
    ...     wait_tensor(t)   # doctest: +SKIP
    ... finally:
    ...     unskip(token)
    """
    if not _LIBRARIES:
        return None
    before = _is_excluded(_BACKEND_SELECT)
    _set_excluded(_BACKEND_SELECT, True)
    return before


def _unskip(token: bool | None) -> None:
    """End what :func:`skip` started (the thread's exclusion as it was before); ``_native.unskip``
    where the extension is built."""
    if token is not None:
        _set_excluded(_BACKEND_SELECT, token)


# set by _install to the pair that knows the kernels it registers
skip: Callable[[], bool | None] = _skip
unskip: Callable[[bool | None], None] = _unskip


def _ops_in(eager: bool) -> Iterator[tuple[str, str, Any]]:
    """(namespace, name, packet) of the ops light capture records: the eager c10d ones, or the
    rest (functional collectives, their waits, DTensor's and symmetric memory's)."""
    for qualified in [*_ops.table_names(), *_ops.WAIT_OPS]:
        namespace, name = qualified.split(".")
        if (namespace == _EAGER_NAMESPACE) != eager:
            continue
        try:
            yield namespace, name, getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            continue  # an op this torch does not have


class _NativeKernels:
    """One ``_native.register`` call's kernels, removed as a ``torch.library.Library`` is."""

    def __init__(self, native: ModuleType, namespace: str, key: str, entries: list[tuple[str, int]]) -> None:
        self.native = native  # the module as it was: a test may take it away meanwhile
        self.handle = native.register(namespace, key, entries)

    def _destroy(self) -> None:
        self.native.unregister(self.handle)


def _register(libraries: dict[str, Any], eager: bool, key: str, below: Any, guard: Any) -> None:
    if _native is not None:
        _register_native(_native, libraries, eager, key, guard)
        return
    for namespace, name, packet in _ops_in(eager):
        spec = _ops.capture_spec(packet)
        library = libraries.get(namespace)
        if library is None:
            library = libraries[namespace] = torch.library.Library(namespace, "IMPL")
        for overload in packet.overloads():
            op = getattr(packet, overload)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an overload registered twice warns; the newer wins
                library.impl(name if overload == "default" else f"{name}.{overload}", _kernel(op, spec, below, guard), key, with_keyset=True)
            if not eager and guard is None and spec is not _ops.WAIT:
                op.redispatch = _redispatch(op, spec)  # shadows OpOverload.redispatch for this op
                _REDISPATCHING.append(op)


def _register_native(native: ModuleType, libraries: dict[str, Any], eager: bool, key: str, guard: Any) -> None:
    """:func:`_register` with the C++ kernel: the same ops at the same keys."""
    entries: dict[str, list[tuple[str, int]]] = {}
    for namespace, name, packet in _ops_in(eager):
        spec = _ops.capture_spec(packet)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            op_name = sys.intern(str(op))
            index = _NATIVE_INDEX.get(op_name)
            if index is None:
                index = _NATIVE_INDEX[op_name] = len(_NATIVE_OPS)
                _NATIVE_OPS.append((op_name, spec))
                _PLAIN_ENTRIES.append(_plain_entry(op, op_name, spec))
            entries.setdefault(namespace, []).append((name if overload == "default" else f"{name}.{overload}", index))
            if not eager and guard is None and spec is not _ops.WAIT and _PLAIN_ENTRIES[index] is None:
                # a call the C++ kernel would hand to Python (all_to_all's splits, send/recv):
                # recorded where a Python autograd kernel redispatches, it skips the trip back
                # into Python from C++ (see _redispatch); the others cost less recorded in C++
                op.redispatch = _redispatch(op, spec)
                _REDISPATCHING.append(op)
    native.set_ops(_PLAIN_ENTRIES)
    for namespace, ops in entries.items():
        libraries[namespace] = _NativeKernels(native, namespace, key, ops)


_ARGUMENT: dict[str | None, int] = {None: -1, "return": -2}  # the C++ side's codes for a spec's inputs and outputs


def _plain_entry(op: Any, op_name: str, spec: Any) -> tuple[str, str, str, int, int, int] | None:
    """What the C++ kernel needs to record a call of ``op_name`` itself (see _native.cpp's
    record_fast), or None where only the Python path reads the call right: point-to-point ops
    (peers, pipelining tags), all_to_all's splits, calls that return done, groups not passed as
    an argument, outputs that are not an argument or the op's one return."""
    if not isinstance(spec, _ops.CollectiveSpec) or spec.is_p2p or spec.splits is not None or spec.returns_done:
        return None
    if type(spec.group) is not int or not (spec.inputs is None or type(spec.inputs) is int):
        return None
    outputs = spec.outputs
    if isinstance(outputs, int):
        outputs_at = outputs
    elif outputs is None or (outputs == "return" and len(op._schema.returns) == 1):
        outputs_at = _ARGUMENT[outputs]
    else:
        return None
    inputs = spec.inputs if isinstance(spec.inputs, int) else _ARGUMENT[None]
    return op_name, sys.intern(spec.op), sys.intern(spec.compat_key), inputs, outputs_at, spec.group


def _native_call(index: int, args: tuple, kwargs: dict, call: Callable[..., Any]) -> Any:
    """The C++ kernel's handler: ``call()`` runs the op; recorded by the innermost light
    recording (the kernel already let through calls on meta tensors and nested ones). An error
    torch raises in the call leaves without this frame, however it was recorded (a detail step's
    dispatch mode records the call inside ``call()``)."""
    try:
        if not _ACTIVE or _STATE.inside:
            return call()
        recorder = _ACTIVE[-1]
        if not recorder._light_on:
            return call()
        name, spec = _NATIVE_OPS[index]
        state = _STATE
        state.inside = True
        try:
            return recorder._light_call(call, name, spec, args, kwargs)
        finally:
            state.inside = False
    except BaseException as e:
        unseen.strip(e)
        raise


def _install() -> None:
    global skip, unskip
    # A functional collective's implementation issues its c10d op through the dispatcher. At
    # BackendSelect, that nested call would pass through a second Python kernel, the dearest
    # one (it boxes the ProcessGroup and ReduceOp objects), only to be let through. Functional
    # collectives run below autograd (their autograd kernel, or the autograd fallback, excludes
    # the autograd keys), so eager c10d kernels at those keys never see the nested calls, and see
    # every other call, from Python or C++ (DDP's reducer). Inference mode excludes those keys
    # too: while it is on, the eager ops also get kernels at BackendSelect (INFERENCE_MODE).
    if _native is not None:
        _native.set_handler(_native_call)
        skip, unskip = _native.skip, _native.unskip
    else:
        skip, unskip = _skip, _unskip
        say_once("native", "light capture records through Python kernels: its C++ kernel (commdebug.capture._native) is not "
                 "built here (it needs torch at build time: pip install --no-build-isolation), which costs a few us more per collective")
    _register(_LIBRARIES, False, KEY, _BELOW, None)
    _register(_LIBRARIES, True, EAGER_KEY, _BELOW_AUTOGRAD, torch._C._AutoDispatchBelowADInplaceOrView)
    INFERENCE_MODE.add(_INFERENCE_USER)
    if torch.is_inference_mode_enabled() and not _INFERENCE:  # a recording started inside one
        _add_inference_kernels()


def _add_inference_kernels() -> None:
    libraries: dict[str, Any] = {}
    _register(libraries, True, KEY, _BELOW, None)
    _INFERENCE.extend(libraries.values())


def _destroy(libraries: list[Any]) -> None:
    for library in libraries:
        library._destroy()


def _kernel(op: Any, spec: Any, below: Any, guard: Any) -> Callable[..., Any]:
    name = sys.intern(str(op))
    redispatch = op._handle.redispatch_boxed  # OpOverload.redispatch adds a Python frame

    # registered with_keyset: the dispatcher hands over the call's key set, so the kernel need
    # not look for the tensor that decides the backend
    def kernel(keys: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            keys = keys & below
            if not keys.raw_repr():  # no tensor to take the backend from: let the dispatcher skip us
                with torch._C._ExcludeDispatchKeyGuard(_OURS):
                    return op(*args, **kwargs)
            return _through(redispatch, keys, name, spec, args, kwargs)
        except BaseException as e:
            unseen.strip(e)
            raise

    if guard is None:
        return kernel

    def below_autograd(keys: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with guard():  # what the autograd fallback this kernel replaces does
                return kernel(keys, *args, **kwargs)
        except BaseException as e:
            unseen.strip(e)
            raise

    return below_autograd


def _redispatch(op: Any, spec: Any) -> Callable[..., Any]:
    """``op.redispatch`` for a functional collective while light capture is on.

    torch writes these ops' autograd kernels in Python (``torch.library.register_autograd``):
    every call already leaves C++ there, and the kernel runs the op below autograd through
    ``op.redispatch``. Recording the call at that point, then redispatching past our
    ``BackendSelect`` kernel, spares each functional collective a second trip through Python
    (boxing its arguments and unboxing them again). Only calls headed straight for our key are
    taken: the first key of their key set is ours. With a dispatch mode, functionalization or
    fake tensors in between, or our key excluded (:func:`skip`), the call goes on unchanged, and
    our kernel sees it if it gets there. An autograd kernel that torch wrote in C++ never calls
    this, and the kernel records."""
    name = sys.intern(str(op))
    redispatch = op._handle.redispatch_boxed

    def recorded(keys: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if keys.highestPriorityTypeId() != _BACKEND_SELECT:
                return redispatch(keys, *args, **kwargs)
            return _through(redispatch, keys - _OURS, name, spec, args, kwargs)
        except BaseException as e:
            unseen.strip(e)
            raise

    return recorded


def _through(redispatch: Callable[..., Any], keys: Any, name: str, spec: Any, args: tuple, kwargs: dict) -> Any:
    """Run a call of a recorded op on ``keys`` (below ours), recorded by the innermost light
    recording: not when a collective is being recorded on this thread already (it is only
    redispatched), when none records now, or on meta tensors (tracing)."""
    state = _STATE
    if state.inside or not _ACTIVE:
        return redispatch(keys, *args, **kwargs)
    recorder = _ACTIVE[-1]
    if not recorder._light_on or keys.has(_META):
        return redispatch(keys, *args, **kwargs)
    state.inside = True
    try:
        return recorder._light_call(partial(redispatch, keys), name, spec, args, kwargs)
    finally:
        state.inside = False


def _enter(original: Any, patch: ClassPatch) -> Any:
    """``torch.inference_mode().__enter__``: the outermost block adds the eager ops'
    BackendSelect kernels (its tensors have no autograd keys to find)."""

    def __enter__(self: Any) -> Any:
        global _inference_depth
        if getattr(self, "mode", True):
            with _LOCK:
                _inference_depth += 1
                if _inference_depth == 1 and _ACTIVE and not _INFERENCE:
                    _add_inference_kernels()
        return original(self)

    return __enter__


def _exit(original: Any, patch: ClassPatch) -> Any:
    """``torch.inference_mode().__exit__``: the outermost block removes them."""

    def __exit__(self: Any, *exc: Any) -> Any:
        global _inference_depth
        if getattr(self, "mode", True):
            with _LOCK:
                _inference_depth = max(0, _inference_depth - 1)
                if _inference_depth == 0:
                    _destroy(_INFERENCE)
                    _INFERENCE.clear()
        return original(self, *exc)

    return __exit__


INFERENCE_MODE = ClassPatch("torch.autograd.grad_mode", "inference_mode", {"__enter__": _enter, "__exit__": _exit})
_INFERENCE_USER = object()

