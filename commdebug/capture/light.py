"""Light capture: every collective, without a TorchDispatchMode on the stack.

A dispatch mode sees every aten op of the program, which is what costs. Light capture instead
registers a Python kernel for the collective ops alone (every op of ``commdebug/ops.py`` that
this torch has, plus ``wait_tensor``), at the ``BackendSelect`` dispatch key. That key is in
every call's dispatch key set, under inference mode and below autograd too, and it sits just
above the backend, so the kernel sees every call that reaches the dispatcher:

- eager c10d (``torch.distributed.all_reduce`` & co., send/recv, barrier, FSDP2's all-gathers
  and reduce-scatters), from Python or from C++ (DDP's reducer);
- functional collectives: DTensor's redistributions, also those inside a DTensor op's own
  dispatch (the Partial gradients an optimizer's ``add_`` reduces), their backward
  collectives, and the autograd-aware variants (seen as the functional op they run);
- collectives on inference tensors (an evaluation metric averaged under ``inference_mode``).

The kernel records the call, then redispatches to the keys below ``BackendSelect``. A
collective's implementation may issue another through the dispatcher (the functional
``all_reduce`` runs c10d's ``allreduce_``): while one is being recorded, the kernels on that
thread only redispatch. Meta tensors (tracing under ``torch.compile``) are never recorded.

The kernels are registered once per process, when the first light recording starts, and stay;
with no light recording active they only redispatch. Limits: a collective that bypasses the
dispatcher (inside a compiled graph's own kernels) is not seen; the DTensor op behind a
collective and the per-module op rows need the dispatch mode, which ``detail_every`` pushes
for some steps.
"""

from __future__ import annotations

import sys
import threading
import warnings
from functools import partial
from typing import Any, Callable

import torch

from commdebug import ops as _ops

__all__ = ["attach", "detach", "KEY"]

KEY = "BackendSelect"
# the keys the kernels redispatch to: the backend's and whatever else lies below ours
_BELOW = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
_dispatch_keys = torch._C._dispatch_keys
_OURS = torch._C.DispatchKeySet(torch._C.DispatchKey.BackendSelect)

# the light recordings active now, innermost last; the kernels report to the innermost
_ACTIVE: list[Any] = []
_LOCK = threading.Lock()
_LIBRARIES: dict[str, Any] = {}  # namespace -> torch.library.Library holding our kernels
_STATE = threading.local()  # .inside: a collective is being recorded on this thread


def attach(recorder: Any) -> None:
    """Start sending collectives to ``recorder._light_call`` (installs the kernels once)."""
    with _LOCK:
        if not _LIBRARIES:
            _install()
        _ACTIVE.append(recorder)


def detach(recorder: Any) -> None:
    """Stop sending collectives to ``recorder``."""
    with _LOCK:
        if recorder in _ACTIVE:
            _ACTIVE.remove(recorder)


def _install() -> None:
    for qualified in [*_ops.table_names(), *_ops.WAIT_OPS]:
        namespace, name = qualified.split(".")
        try:
            packet = getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            continue  # an op this torch does not have
        spec = _ops.capture_spec(packet)
        library = _LIBRARIES.get(namespace)
        if library is None:
            library = _LIBRARIES[namespace] = torch.library.Library(namespace, "IMPL")
        for overload in packet.overloads():
            op = getattr(packet, overload)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an overload registered twice warns; the newer wins
                library.impl(name if overload == "default" else f"{name}.{overload}", _kernel(op, spec), KEY)


def _kernel(op: Any, spec: Any) -> Callable[..., Any]:
    name = sys.intern(str(op))
    redispatch = op.redispatch

    def kernel(*args: Any, **kwargs: Any) -> Any:
        t = _first_tensor(args, kwargs)
        if t is None:  # nothing to take the backend from: let the dispatcher skip our key
            with torch._C._ExcludeDispatchKeyGuard(_OURS):
                return op(*args, **kwargs)
        keys = _dispatch_keys(t) & _BELOW
        recorder = _ACTIVE[-1] if _ACTIVE else None
        if recorder is None or not recorder._light_on or t.is_meta or getattr(_STATE, "inside", False):
            return redispatch(keys, *args, **kwargs)
        _STATE.inside = True
        try:
            return recorder._light_call(partial(redispatch, keys), name, spec, args, kwargs)
        finally:
            _STATE.inside = False

    return kernel


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The tensor that decides where a collective runs: the first tensor (or first of a list of
    them) among its arguments; None for a call without one (an empty list)."""
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return a[0]
    return None
