"""commdebug: see every collective a PyTorch distributed program issues.

>>> from commdebug import CommDebugMode
>>> comm = CommDebugMode()
>>> with comm:
...     pass  # your training steps
>>> comm.get_total_counts()
0

The public API is what this module exports (``__all__``): record with :class:`CommDebugMode`;
read files with :func:`load` (one dump, with its module tree), :func:`read` (ours or Flight
Recorder's) and :func:`iter_ranks` (a folder, a rank at a time); analyse with :func:`check`,
:func:`report`, :func:`summarize`, :func:`trace_predictions` and :func:`rank_modules`; write
with :func:`write_output`. The viewer package uses nothing else. The analyses load on first
use: ``import commdebug`` stays as cheap as the recorder needs (every rank of ``commdebug run``
imports it at start-up).
"""

from typing import Any

from commdebug.debug_mode import CommDebugMode
from commdebug.errors import CommDebugError, DumpError
from commdebug.fileio import write_output
from commdebug.formats.readers import iter_ranks, load, read
from commdebug.model.dump import from_dump_dict, to_dump_dict
from commdebug.model.rank_view import RankView
from commdebug.model.trace import PHASES, CollectiveEvent, Trace
from commdebug.version import __version__

# name -> module of the names loaded on first use
_LAZY = {
    "check": "commdebug.analysis.check",
    "report": "commdebug.analysis.report",
    "summarize": "commdebug.analysis.summary",
    "trace_predictions": "commdebug.analysis.predicted",
    "rank_modules": "commdebug.analysis.rank_modules",
}

__all__ = ["CommDebugMode", "Trace", "CollectiveEvent", "RankView", "load", "read", "iter_ranks", "to_dump_dict",
           "from_dump_dict", "PHASES", "write_output", "CommDebugError", "DumpError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'commdebug' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
