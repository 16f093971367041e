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
:func:`report`, :func:`summarize`, :func:`trace_predictions` and :func:`rank_modules`; word a
``check`` finding as the command line does with :func:`describe_finding` and
:func:`describe_side`, why it can give no verdict with :func:`no_verdict`, and how a rank
ended with :func:`rank_ending`; write with
:func:`write_output`. The viewer package uses nothing else. Every name loads on first use:
``import commdebug`` imports neither torch nor the analyses, so the offline verbs start in
milliseconds, and torch loads with :class:`CommDebugMode` (recording).
"""

from typing import TYPE_CHECKING, Any

from commdebug.version import __version__

if TYPE_CHECKING:  # for type checkers; at run time each name loads on first use (__getattr__)
    from commdebug.analysis.check import check
    from commdebug.analysis.predicted import trace_predictions
    from commdebug.analysis.rank_modules import rank_modules
    from commdebug.analysis.report import report
    from commdebug.analysis.summary import summarize
    from commdebug.debug_mode import CommDebugMode
    from commdebug.errors import CommDebugError, DumpError
    from commdebug.fileio import write_output
    from commdebug.formats.readers import iter_ranks, load, read
    from commdebug.model.dump import from_dump_dict, to_dump_dict
    from commdebug.model.rank_view import RankView
    from commdebug.model.trace import PHASES, CollectiveEvent, Trace
    from commdebug.render.check import describe_finding, describe_side, no_verdict
    from commdebug.render.endings import rank_ending

# name -> module it is loaded from on first use: only recording (CommDebugMode) imports torch, so
# `import commdebug` and every offline verb (check, report, view, ...) start without it
_LAZY = {
    "CommDebugMode": "commdebug.debug_mode",
    "Trace": "commdebug.model.trace",
    "CollectiveEvent": "commdebug.model.trace",
    "PHASES": "commdebug.model.trace",
    "RankView": "commdebug.model.rank_view",
    "load": "commdebug.formats.readers",
    "read": "commdebug.formats.readers",
    "iter_ranks": "commdebug.formats.readers",
    "to_dump_dict": "commdebug.model.dump",
    "from_dump_dict": "commdebug.model.dump",
    "write_output": "commdebug.fileio",
    "CommDebugError": "commdebug.errors",
    "DumpError": "commdebug.errors",
    "check": "commdebug.analysis.check",
    "report": "commdebug.analysis.report",
    "summarize": "commdebug.analysis.summary",
    "trace_predictions": "commdebug.analysis.predicted",
    "rank_modules": "commdebug.analysis.rank_modules",
    "traffic_path": "commdebug.analysis.traffic",
    "describe_finding": "commdebug.render.check",
    "describe_side": "commdebug.render.check",
    "no_verdict": "commdebug.render.check",
    "rank_ending": "commdebug.render.endings",
}

# a literal list (not built from _LAZY): type checkers and linters read it as written;
# tests/test_no_torch.py checks the two agree
__all__ = ["CommDebugMode", "Trace", "CollectiveEvent", "RankView", "load", "read", "iter_ranks", "to_dump_dict",
           "from_dump_dict", "PHASES", "write_output", "CommDebugError", "DumpError", "__version__", "check", "report",
           "summarize", "trace_predictions", "rank_modules", "traffic_path", "describe_finding", "describe_side",
           "rank_ending", "no_verdict"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'commdebug' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
