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

from commdebug.errors import DumpError
from commdebug.formats.profile_join import PROFILE_SUFFIX, profile_path_for
from commdebug.formats.profiler import rank_in_name
from commdebug.model.stream import STREAM_SUFFIX

__all__ = ["is_trace_name", "trace_rank", "peek_rank", "profiles_with_their_dumps", "refuse_two_of_a_rank", "NO_RANK"]

NO_RANK = 1 << 62  # the order of a trace whose rank neither its name nor its head says: last

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


def profiles_with_their_dumps(files: list[Path]) -> list[Path]:
    """The files less the profiles (``rank<R>.profile.json.gz``) of ranks that have a dump or a
    stream: those are read with it (the readers attach it), so the rank counts once."""
    taken = {profile_path_for(f) for f in files if not f.name.endswith(PROFILE_SUFFIX) and f.suffix in (".json", STREAM_SUFFIX)}
    return [f for f in files if f not in taken]


def refuse_two_of_a_rank(folder: Path, files: list[Path], ranks: dict[Path, int]) -> None:
    """Profiler traces are told apart by rank and world size only: two of one rank, or of
    different world sizes, are two jobs' traces."""
    traces = [f for f in files if is_trace_name(f.name)]
    if not traces:
        return
    by_rank: dict[int, list[Path]] = {}
    for f in files:
        if ranks[f] < NO_RANK and (f in traces or f.suffix in (".json", STREAM_SUFFIX)):
            by_rank.setdefault(ranks[f], []).append(f)
    for rank, holders in sorted(by_rank.items()):
        if len(holders) > 1 and any(h in traces for h in holders):
            raise DumpError(f"{folder}: {' and '.join(h.name for h in holders[:3])} all claim rank {rank}: one folder holds "
                            "one job's ranks, one file each (two jobs' traces?)")
    sizes = {f: peek_rank(f)[1] for f in traces}
    known = {s for s in sizes.values() if s is not None}
    if len(known) > 1:
        shown = "; ".join(f"{f.name}: {s}" for f, s in list(sizes.items())[:4] if s is not None)
        raise DumpError(f"{folder}: the traces come from jobs of different world sizes ({shown}): two jobs' traces in one folder?")
