"""A rank's profile joined to its dump: each collective the profiler saw paired with the event
commdebug recorded for it, so the profile's kernel times gain the dump's module, phase, source
line and DTensor op, and the dump's events in the profiled steps gain the profile's latencies.

``commdebug run --profile-steps A-B`` writes ``rank<R>.profile.json.gz`` beside ``rank<R>.json``;
the readers attach it to the rank (:func:`attach_profile`): the rank counts once.

Pairing: the dump's events of the profiled steps and the profile's calls are the same calls of
one process in the same order. Where the trace names groups (NCCL's ``record_param_comms``), each
group's calls are paired in order, and sends and receives per (group, op, peer); where it does
not (gloo), the whole sequence is, in the order of the ``c10d::*`` ops on the program's thread.
The ops must agree call by call: at the first that does not, pairing stops there and a note says
where. What makes a join untrustworthy is said in one line each, never joined silently:

- the dump does not hold every event of the profiled steps (``--start-step`` / ``--end-step``,
  ``--keep-steps``, ``max_events``): nothing is joined;
- the steps were timed with ``--timing sync``, which waits for each collective and so changes the
  overlap being measured: joined, and said.

    >>> view = load_rank("traces/rank0.json")      # doctest: +SKIP
    >>> view.profile.joined[:3]                    # doctest: +SKIP
    [12, 13, 14]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from commdebug.errors import DumpError
from commdebug.model.aggregates import older_of
from commdebug.model.profile import Profile
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent

__all__ = ["PROFILE_SUFFIX", "profile_path_for", "attach_profile", "join"]

PROFILE_SUFFIX = ".profile.json.gz"  # rank<R>.profile.json.gz, beside rank<R>.json


def profile_path_for(dump: Path) -> Path:
    """Where ``commdebug run --profile-steps`` writes the profile of the rank whose dump (or
    stream) is ``dump``: ``traces/rank3.json`` -> ``traces/rank3.profile.json.gz``."""
    stem = dump.name.split(".", 1)[0]
    return dump.with_name(stem + PROFILE_SUFFIX)


def attach_profile(view: RankView, read: Callable[[Path], Profile]) -> RankView:
    """``view`` (a rank's dump or stream) with its profile attached and joined, when the folder
    holds one; the profile read by ``read``."""
    path = profile_path_for(view.path)
    if not path.is_file():
        return view
    profile = read(path)
    if profile.rank is not None and profile.rank != view.rank:
        raise DumpError(f"{path}: a profile of rank {profile.rank} beside the dump of rank {view.rank} ({view.path}): "
                        "two jobs' files in one folder?")
    view.profile = profile
    view.notes.extend(join(view, profile))
    return view


def _steps_recorded(view: RankView, lo: int, hi: int) -> str | None:
    """Why the dump does not hold every event of steps lo..hi, or None when it does."""
    meta = view.metadata
    start, end = meta.get("start_step"), meta.get("end_step")
    if isinstance(start, int) and start > lo or isinstance(end, int) and end <= hi:
        return f"the recording window (--start-step {start}, --end-step {end}) leaves out some of the profiled steps {lo}-{hi}"
    older = older_of(view)
    if older is not None and older.events:
        kept_from = min((e.step for e in view.events), default=None)
        if kept_from is None or kept_from > lo:
            return f"the dump keeps steps before {kept_from} as totals only (--keep-steps), and the profile covers steps {lo}-{hi}"
    first = min((e.step for e in view.events), default=None)
    if first is not None and first > lo and any("dropped (max_events)" in n for n in view.notes):
        return f"the dump dropped its oldest events (max_events), some of the profiled steps {lo}-{hi} among them"
    return None


def join(view: RankView, profile: Profile) -> list[str]:
    """Pair ``profile.calls`` with ``view.events`` (see the module docstring): set
    ``profile.joined`` and give the paired events the profile's latencies; the notes to say."""
    notes: list[str] = []
    numbers = [s.number for s in profile.steps]
    profile.joined = [-1] * len(profile.calls)
    if not numbers:
        return ["its profile has no ProfilerStep spans: not joined to the dump (record with --profile-steps)"]
    lo, hi = min(numbers), max(numbers)
    why = _steps_recorded(view, lo, hi)
    if why is not None:
        return [f"its profile is not joined to the dump: {why}"]
    if view.metadata.get("timing") == "sync":
        notes.append(f"steps {lo}-{hi} were profiled under --timing sync, which waits for each collective: their "
                     "communication cannot overlap compute, so the overlap measured is not the program's own")
    mine = [i for i, e in enumerate(view.events) if lo <= e.step <= hi]
    named = any(c.group.name != "?" for c in profile.calls)
    pairs, stop = (_by_group if named else _in_order)(profile.calls, [(i, view.events[i]) for i in mine])
    for call, event in pairs:
        profile.joined[call] = event
        latency = profile.calls[call].latency_s
        if latency is not None:
            view.events[event] = view.events[event]._replace(latency_s=latency)
    if stop is not None:
        notes.append(stop)
    joined = len(pairs)
    if joined < len(profile.calls) or joined < len(mine):
        notes.append(f"steps {lo}-{hi}: {joined} of the profile's {len(profile.calls)} collectives joined to the dump's "
                     f"{len(mine)} events of those steps")
    if joined:
        timed = sum(1 for c, _ in pairs if profile.calls[c].latency_s is not None)
        if timed:
            source = "the NCCL kernels'" if profile.device == "gpu" else "gloo's"
            notes.append(f"steps {lo}-{hi}: {timed} collectives timed by the profile ({source} own time), not by --timing")
        else:  # gloo on CUDA tensors, or one NCCL rank (a copy, no NCCL kernel): seen on an H100
            notes.append(f"steps {lo}-{hi}: the profile holds no communication kernel or backend span of its {joined} "
                         "collectives, so it times none of them (their latencies are --timing's, where it was on)")
    return notes


def _agree(call: CollectiveEvent, event: CollectiveEvent) -> bool:
    return call.op == event.op


def _stop(k: int, call: CollectiveEvent, event: CollectiveEvent) -> str:
    return (f"the profile's collective #{k} is {call.op} where the dump's is {event.op} (step {event.step}, "
            f"{event.source or event.module}): joined up to there only")


def _in_order(calls: list[CollectiveEvent], events: list[tuple[int, CollectiveEvent]]) -> tuple[list[tuple[int, int]], str | None]:
    """Pairs in issue order (a trace that names no groups)."""
    pairs: list[tuple[int, int]] = []
    for k, (call, (i, event)) in enumerate(zip(calls, events, strict=False)):
        if not _agree(call, event):
            return pairs, _stop(k, call, event)
        pairs.append((k, i))
    return pairs, None


def _lanes(items: Iterable[tuple[int, CollectiveEvent]]) -> dict[tuple, list[tuple[int, CollectiveEvent]]]:
    """Calls by the order they keep: a group's collectives, a (group, op, peer)'s sends or receives."""
    out: dict[tuple, list[tuple[int, CollectiveEvent]]] = defaultdict(list)
    for i, e in items:
        out[(e.group.name, e.op, e.peer) if e.seq is None else (e.group.name,)].append((i, e))
    return out


def _by_group(calls: list[CollectiveEvent], events: list[tuple[int, CollectiveEvent]]) -> tuple[list[tuple[int, int]], str | None]:
    """Pairs per group in order (a trace that names its groups)."""
    theirs = _lanes(enumerate(calls))
    mine = _lanes(events)
    pairs: list[tuple[int, int]] = []
    stops = []
    for lane, their_calls in theirs.items():
        for (k, call), (i, event) in zip(their_calls, mine.get(lane, []), strict=False):
            if not _agree(call, event):
                stops.append(_stop(k, call, event))
                break
            pairs.append((k, i))
    pairs.sort()
    return pairs, stops[0] if stops else None
