"""torch.profiler trace files in a folder: which files are traces (by name), and whose rank each
holds, from its name or from the ``distributedInfo`` at its head, read without parsing it all.

Names: ``*.pt.trace.json`` (torch's ``tensorboard_trace_handler``), ``*.json.gz`` (a trace
exported gzipped; ``rank<R>.profile.json.gz`` from ``commdebug run --profile-steps``), each
maybe gzipped. The rank: ``distributedInfo.rank`` where the head of the file says it (Kineto
writes it before the events), else a ``rank<N>`` in the name (a trace written before
torch.distributed was initialised has no distributedInfo).

    >>> is_trace_name("host_1234.1700000000000.pt.trace.json.gz")
    True
    >>> trace_rank(Path("traces/rank3.pt.trace.json"))   # doctest: +SKIP
    3
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache
from pathlib import Path

from commdebug.formats.profiler import rank_in_name

__all__ = ["is_trace_name", "trace_rank", "peek_rank"]

_HEAD = 1 << 20  # bytes of a trace's head searched for distributedInfo
_INFO = re.compile(rb'"distributedInfo"\s*:\s*\{')
_RANK = re.compile(rb'"rank"\s*:\s*(-?\d+)')
_WORLD = re.compile(rb'"world_size"\s*:\s*(\d+)')


def is_trace_name(name: str) -> bool:
    """Whether a file name is a torch.profiler trace's (``.pt.trace.json``, ``.json.gz``)."""
    return name.endswith((".pt.trace.json", ".pt.trace.json.gz", ".json.gz"))


def trace_rank(path: Path) -> int | None:
    """The rank a trace holds: its distributedInfo's, else its name's, else None."""
    rank, _ = peek_rank(path)
    return rank if rank is not None else rank_in_name(path.name)


@lru_cache(maxsize=4096)
def _peek(path: Path, mtime_ns: int) -> tuple[int | None, int | None]:
    try:
        with open(path, "rb") as f:
            raw = f.read(_HEAD)
    except OSError:
        return None, None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = zlib.decompressobj(31).decompress(raw, _HEAD)
        except zlib.error:
            return None, None
    m = _INFO.search(raw)
    if m is None:
        return None, None
    end = raw.find(b"}", m.end())  # the flat part of distributedInfo, before pg_config's objects
    head = raw[m.end(): end if end != -1 else None]
    cut = head.find(b'"pg_config"')
    head = head[:cut] if cut != -1 else head
    rank, world = _RANK.search(head), _WORLD.search(head)
    return (int(rank.group(1)) if rank else None), (int(world.group(1)) if world else None)


def peek_rank(path: Path) -> tuple[int | None, int | None]:
    """(rank, world size) from the distributedInfo at a trace's head; None where it has none."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None, None
    return _peek(path, mtime)
