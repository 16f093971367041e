"""What a late rank ran in its gap, from its profile: the ``gap_top`` of ``commdebug report``'s
late ranks (:mod:`commdebug.analysis.late`).

A late call's gap is the time between the end of the rank's previous collective and the start of
this one, on the rank's recording clock (its events' ``start_s``). Where the rank has a profile
(a torch.profiler trace: ``commdebug run --profile-steps`` beside its dump, or the trace itself),
the gap is moved to the trace's clock and the profile's compute that belongs to it is summed by
name: on a GPU trace the kernels launched in it, with their whole GPU time (the host gap can be
short while the GPU is late: the call waits behind them on its stream), on a CPU trace the
program's own ops inside it.

The two clocks differ by a constant within one process: for a joined profile it is taken from
the calls both recorded (the median of their differences), for a trace read alone the events'
times are the trace's own. Only the ranks a report lists are looked at: their profiles are read
again, one file each, when asked (never the whole folder a second time).

    >>> gaps = ProfileGaps("traces/")                   # doctest: +SKIP
    >>> gaps(3, 12.40, 13.21)                           # doctest: +SKIP
    [{'name': 'aten::mm', 'total_s': 0.79, 'count': 12, 'on': 'cpu'}, ...]
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commdebug.errors import DumpError
from commdebug.model.profile import Profile
from commdebug.model.rank_view import RankView

if TYPE_CHECKING:
    from commdebug.formats.folders import Dumps

__all__ = ["ProfileGaps", "clock_offset_us", "ops_between", "GAP_TOP"]

GAP_TOP = 5  # names kept per gap, most time first


def clock_offset_us(view: RankView) -> float | None:
    """What to add to a rank's recording-clock times (seconds, its events' ``start_s``), in
    microseconds, to have the trace's times; None where the profile and the events share no call."""
    profile = view.profile
    if profile is None:
        return None
    if view.source_format == "torch-profiler":  # its events are the trace's calls
        return profile.origin_us
    pairs = [(profile.calls[c].start_s, view.events[e].start_s) for c, e in enumerate(profile.joined or []) if e >= 0]
    diffs = [c * 1e6 + profile.origin_us - e * 1e6 for c, e in pairs if c is not None and e is not None]
    return statistics.median(diffs) if diffs else None


def ops_between(profile: Profile, start_us: float, end_us: float, top: int = GAP_TOP) -> list[dict[str, Any]]:
    """The compute of ``profile`` that belongs to the gap [start_us, end_us] (trace clock), its
    time summed by name, most first: ``[{"name", "total_s", "count", "on"}]``.

    On a CPU trace (``on: "cpu"``), the ops that ran in the gap, their time inside it. On a GPU
    trace (``on: "gpu"``), the kernels *launched* in the gap, each with its whole GPU time: the
    collective runs after them in stream order, so they are what held it up, however short the
    host gap (on an H100 a rank that queued 0.88 s of matrix products spent 81 ms of host time
    launching them, and 80 ms of them ran within those 81 ms). A kernel whose launch the trace
    lacks counts by its time inside the gap."""
    gpu = profile.device == "gpu"
    totals: dict[int, list[float]] = {}
    for s, e, launched, ref in profile.compute:
        if gpu and launched == launched:  # not NaN: its launch is known
            if not start_us <= launched <= end_us:
                continue
            took = e - s
        elif e <= start_us or s >= end_us:
            continue
        else:
            took = min(e, end_us) - max(s, start_us)
        cell = totals.setdefault(ref, [0.0, 0])
        cell[0] += took
        cell[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], profile.names[kv[0]]))[:top]
    on = "gpu" if gpu else "cpu"
    return [{"name": profile.names[i], "total_s": t / 1e6, "count": int(n), "on": on} for i, (t, n) in ranked]


class ProfileGaps:
    """The :data:`~commdebug.analysis.late.GapOps` of a job (folders, or files): for a listed late
    rank, its profile read once (``load_rank`` of its file) and the gap's ops looked up there;
    [] for a rank with no profile, or whose profile does not cover the gap's time."""

    def __init__(self, path: Dumps, load: Callable[[Path], RankView] | None = None) -> None:
        from commdebug.formats.folders import rank_files, rank_from_name
        from commdebug.formats.readers import load_rank

        self.load = load or load_rank
        self.files: dict[int, Path] = {}
        try:
            for f in rank_files(path):
                self.files.setdefault(rank_from_name(f), f)
        except DumpError:
            pass  # the report itself says what is wrong with the folder
        self._cache: dict[int, tuple[Profile, float] | None] = {}

    def _profile(self, rank: int) -> tuple[Profile, float] | None:
        from commdebug.formats.profile_files import is_trace_name
        from commdebug.formats.profile_join import profile_path_for

        if rank not in self._cache:
            found = None
            f = self.files.get(rank)
            # a dump is read again only when a profile lies beside it
            if f is not None and (is_trace_name(f.name) or profile_path_for(f).is_file()):
                try:
                    view = self.load(f)
                except DumpError:
                    view = None
                offset = clock_offset_us(view) if view is not None else None
                if view is not None and view.profile is not None and offset is not None:
                    found = (view.profile, offset)
            self._cache[rank] = found
        return self._cache[rank]

    def __call__(self, rank: int, start_s: float, end_s: float) -> list[dict[str, Any]]:
        found = self._profile(rank)
        if found is None:
            return []
        profile, offset = found
        return ops_between(profile, start_s * 1e6 + offset, end_s * 1e6 + offset)
