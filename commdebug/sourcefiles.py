"""Which source files are the user's: where a collective's ``source`` line may point.

Never torch, commdebug, the standard library (functools, contextlib, runpy, ...) or
typing_extensions (its deprecation decorator wraps ``dist.all_gather_into_tensor``). Used on
live frames by the capture path and on file names recorded elsewhere (Flight Recorder frames,
possibly from another machine, hence the path-fragment test as well)."""

from __future__ import annotations

import os
import sysconfig
from importlib.util import find_spec

__all__ = ["NOT_USER_DIRS", "NOT_USER_MODULES", "is_user_file"]

def _torch_dir() -> str:
    """torch's folder, found without importing torch (offline verbs never load it)."""
    spec = find_spec("torch")
    origin = spec.origin if spec is not None else None
    return os.path.dirname(origin) + os.sep if origin else os.sep + "torch" + os.sep


_TORCH_DIR = _torch_dir()
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
NOT_USER_DIRS = tuple({_TORCH_DIR, _OWN_DIR, *(sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib"))})
NOT_USER_MODULES = frozenset({"typing_extensions"})
# the same places as seen in a path from any machine
_FRAGMENTS = tuple(f"{sep}{name}{sep}" for sep in ("/", "\\") for name in ("torch", "commdebug"))


def is_user_file(filename: str) -> bool:
    """Whether a frame in ``filename`` can be the user's code.

    >>> is_user_file("/home/me/train.py"), is_user_file("<frozen runpy>")
    (True, False)
    """
    if not filename or filename.startswith(("<frozen", "<string>")) or filename.startswith(NOT_USER_DIRS):
        return False
    if any(f in filename for f in _FRAGMENTS) or os.path.basename(filename) == "typing_extensions.py":
        return False
    # another machine's standard library: .../lib/python3.X/<module>.py, not its site-packages
    parts = filename.replace("\\", "/").split("/")
    return not (len(parts) > 2 and parts[-2].startswith("python3") and parts[-3] == "lib")
