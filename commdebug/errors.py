"""Errors a user can hit, each with one clear message; the sentences several verbs say about
the same input (a path that does not exist, an empty file, a folder with no dumps) are made
here once, so every verb words them alike."""

from __future__ import annotations

import os

__all__ = ["CommDebugError", "DumpError", "missing_path", "empty_file", "no_rank_dumps"]


class CommDebugError(Exception):
    """Base of every error commdebug raises on purpose; the CLI prints it as one line."""


class DumpError(CommDebugError):
    """A dump file that cannot be read: missing, not JSON, not a dump, or an unknown schema."""


def missing_path(path: str | os.PathLike) -> DumpError:
    """A path that does not exist, whatever the verb expected there (a dump, a folder, a file).

    >>> str(missing_path("traces"))
    'traces: no such file or folder'
    """
    return DumpError(f"{path}: no such file or folder")


def empty_file(path: str | os.PathLike) -> DumpError:
    """A file of 0 bytes (a rank killed as it opened its dump, a copy that failed), never a
    parse error about its first character."""
    return DumpError(f"{path}: empty file (0 bytes)")


def no_rank_dumps(folder: str | os.PathLike) -> DumpError:
    """A folder holding no file a rank's dump could be."""
    return DumpError(f"{folder}: no rank dumps in this folder (expected rank<N>.json, Flight Recorder files or torch.profiler traces)")
