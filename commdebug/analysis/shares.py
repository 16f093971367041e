"""The time a communication share is over: the time its numerator covers.

A rank's communication time sums the latencies of its timed calls. Where every step that holds
calls has timed calls (``--timing``, a profiler trace of its own), that is the recorded time.
Where only some steps are timed (``--profile-steps 1-3`` of a run without ``--timing``: the
profile times the calls of its steps only), the share is over the summed time of those steps, as
the profile's ``ProfilerStep`` spans give it, never over every step's. Where those durations are
not recorded, there is no share (None), and :class:`ShareBase` says why. A recording that timed
its calls (``timing`` on) is over its recorded time, even where a step holds no timed call (the
calls of the step a rank died in, which failed or were never waited for).

    >>> base = share_base(trace.events, trace.metadata, trace.profile)   # doctest: +SKIP
    >>> base.seconds, base.timed_steps, base.steps                       # doctest: +SKIP
    (0.612, 3, 6)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from commdebug.model.trace import CollectiveEvent

__all__ = ["ShareBase", "share_base"]


@dataclass(frozen=True)
class ShareBase:
    """What a share's denominator is: ``seconds`` (None: not known), over ``timed_steps`` of the
    ``steps`` that hold calls; ``partial`` when those differ (the text then says so)."""

    seconds: float | None
    timed_steps: int
    steps: int

    @property
    def partial(self) -> bool:
        return self.timed_steps < self.steps

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "timed_steps": self.timed_steps, "steps": self.steps}

    def note(self) -> str:
        """What a partial base says of a rank's share: "calls timed in 2 of 4 steps: the share is
        over those steps' time"."""
        over = "those steps' time" if self.seconds is not None else "nothing (their durations were not recorded)"
        return f"calls timed in {self.timed_steps} of {self.steps} steps: the share is over {over}"


def share_base(events: Iterable[CollectiveEvent], metadata: dict[str, Any], profile: Any = None,
               older_steps: dict[int, list] | None = None) -> ShareBase:
    """The denominator of a rank's communication share (see the module docstring). ``profile``:
    its :class:`~commdebug.model.profile.Profile`, when one is attached; ``older_steps``: the
    per-step totals of calls kept as totals only (``keep_steps``: [calls, bytes, timed, seconds])."""
    steps: set[int] = set()
    timed: set[int] = set()
    for e in events:
        steps.add(e.step)
        if e.latency_s is not None:
            timed.add(e.step)
    for step, totals in (older_steps or {}).items():
        steps.add(step)
        if totals[2]:
            timed.add(step)
    recorded = metadata.get("recorded_s", metadata.get("elapsed_s"))
    if timed == steps or metadata.get("timing") not in (None, "off"):
        # the recording timed every call it could: a step without a timed call is one whose
        # calls failed or were never waited for (a rank that died in it), not a step left out
        return ShareBase(recorded if isinstance(recorded, (int, float)) else None, len(steps), len(steps))
    spans = {s.number: (s.end - s.start) / 1e6 for s in getattr(profile, "steps", None) or ()}
    if timed and timed.issubset(spans):
        return ShareBase(sum(spans[s] for s in timed), len(timed), len(steps))
    return ShareBase(None, len(timed), len(steps))
