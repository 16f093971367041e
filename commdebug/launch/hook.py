"""Install or remove the start-up hook: a ``.pth`` file in site-packages whose one line imports
:mod:`commdebug.launch.autostart` only when ``COMMDEBUG`` is set, so that any Python program in
this environment can be recorded without changing its launch line. Unset, it costs one
dictionary lookup at start-up."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from commdebug.errors import CommDebugError
from commdebug.fileio import write_output

__all__ = ["HOOK_NAME", "hook_path", "install", "uninstall", "installed"]

HOOK_NAME = "commdebug_autostart.pth"
# one line: site.py executes .pth lines that start with "import"
HOOK_LINE = "import os; os.environ.get('COMMDEBUG', '0') not in ('', '0') and __import__('commdebug.launch.autostart')\n"


def hook_path(site_dir: str | os.PathLike | None = None) -> Path:
    return Path(site_dir or sysconfig.get_paths()["purelib"]) / HOOK_NAME


def install(site_dir: str | os.PathLike | None = None) -> Path:
    path = hook_path(site_dir)
    if not path.parent.is_dir():
        raise CommDebugError(f"{path.parent}: no such site-packages folder")
    return write_output(path, HOOK_LINE)


def uninstall(site_dir: str | os.PathLike | None = None) -> Path | None:
    path = hook_path(site_dir)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CommDebugError(f"cannot remove {path}: {e.strerror or e}") from None
    return path


def installed(site_dir: str | os.PathLike | None = None) -> bool:
    path = hook_path(site_dir)
    return path.is_file() and path.read_text(encoding="utf-8") == HOOK_LINE
