"""What one rank's torch.profiler trace says about time: when communication ran, when compute
ran, and which collective each communication activity belongs to (:class:`Profile`).

A profile is read from a torch.profiler (Kineto) Chrome trace by
:mod:`commdebug.formats.profiler`, alone (a user's own trace) or beside the rank's dump
(``commdebug run --profile-steps``, joined to the dump's events). ``commdebug overlap``
(:mod:`commdebug.analysis.overlap`) measures from it how much of the communication ran under
compute and how much was exposed.

Times are the trace's own, in microseconds on the rank's host clock. Activities are kept as flat
arrays (a GPU trace has tens of thousands of kernels): for each, its start and end, the time it
was launched on the CPU (the ``cudaLaunchKernel`` that queued a kernel; a CPU activity's own
start), and for communication the collective it belongs to (an index into ``calls``, -1 when
none is known) or for compute its name (an index into ``names``, for "what ran there").

    >>> profile = read_profile(Path("traces/rank0.profile.json.gz"))   # doctest: +SKIP
    >>> len(profile.comm), profile.device
    (21, 'gpu')
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.model.trace import CollectiveEvent

__all__ = ["Activities", "ProfileStep", "Profile"]


class Activities:
    """Intervals of one kind (communication or compute) as parallel flat arrays."""

    __slots__ = ("start", "end", "launch", "ref")

    def __init__(self) -> None:
        self.start = array("d")
        self.end = array("d")
        self.launch = array("d")  # NaN: its launch is not in the trace
        self.ref = array("i")  # communication: index into Profile.calls (-1: none); compute: into Profile.names

    def add(self, start: float, end: float, launch: float, ref: int) -> None:
        self.start.append(start)
        self.end.append(end)
        self.launch.append(launch)
        self.ref.append(ref)

    def __len__(self) -> int:
        return len(self.start)

    def __iter__(self) -> Iterator[tuple[float, float, float, int]]:
        return zip(self.start, self.end, self.launch, self.ref, strict=True)

    def __getstate__(self) -> tuple[bytes, bytes, bytes, bytes]:
        return self.start.tobytes(), self.end.tobytes(), self.launch.tobytes(), self.ref.tobytes()

    def __setstate__(self, state: tuple[bytes, bytes, bytes, bytes]) -> None:
        self.start, self.end, self.launch, self.ref = array("d"), array("d"), array("d"), array("i")
        self.start.frombytes(state[0])
        self.end.frombytes(state[1])
        self.launch.frombytes(state[2])
        self.ref.frombytes(state[3])


@dataclass(frozen=True)
class ProfileStep:
    """One ``ProfilerStep#N`` span: the step's number and its CPU start and end."""

    number: int
    start: float
    end: float


@dataclass
class Profile:
    """One rank's profiled time (see the module docstring).

    ``device``: ``"gpu"`` when the trace has GPU activities (kernels on streams): communication
    is then the NCCL kernels and compute the other kernels; ``"cpu"`` otherwise: communication is
    the backend's own spans (``gloo:*``) and compute the program threads' CPU ops outside the
    collective calls.

    ``calls``: the collectives the trace shows the program issued, in the order it issued them,
    as events (what a trace does not say is left unknown: ``"?"`` module, phase from the trace's
    evidence, group ``"?"`` where it names none). ``joined``: once the profile is joined to the
    rank's dump, for each call the index of the dump's event it is (-1: not joined).
    """

    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    device: str  # "gpu" | "cpu"
    steps: list[ProfileStep]
    comm: Activities
    compute: Activities
    names: list[str]
    calls: list[CollectiveEvent]
    origin_us: float  # the trace time that events' start_s count from
    hostname: str | None = None
    notes: list[str] = field(default_factory=list)
    joined: list[int] | None = None
    fractional: bool = False  # some times have sub-microsecond digits (HTA rounds those)
    _starts: list[float] | None = field(default=None, repr=False, compare=False)

    @property
    def window_end(self) -> float | None:
        """Where the whole-trace figures stop, as HTA 0.5.0 counts them: with two or more
        ``ProfilerStep`` spans, only activities launched before the last one begins (the last
        step of a trace is usually cut short); None: everything counts."""
        return self.steps[-1].start if len(self.steps) >= 2 else None

    def step_of(self, t: float) -> int | None:
        """The number of the step a time belongs to: the last step that began at or before it
        (a time before the first step belongs to the first); None without steps."""
        if not self.steps:
            return None
        if self._starts is None or len(self._starts) != len(self.steps):
            self._starts = [s.start for s in self.steps]
        i = bisect_right(self._starts, t) - 1
        return self.steps[max(i, 0)].number

    def summary(self) -> dict[str, Any]:
        """A few figures about the trace, for notes and ``--json``."""
        return {"path": str(self.path), "device": self.device, "steps": [s.number for s in self.steps],
                "comm_activities": len(self.comm), "compute_activities": len(self.compute), "calls": len(self.calls)}
