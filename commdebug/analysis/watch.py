"""The live state of a running job, and its verdict: ``commdebug watch`` over a folder of rank
streams (a shared file system is enough: no socket between ranks), and the ``/commdebug`` page
of torch's debug server over the ranks' answers. Data only; the wording is
:mod:`commdebug.render.watch`'s.

Per rank: its step, its communication per recent step (seconds when timed, else calls), its
last collective, and the collective it has been waiting in, if any. Then:

- a rank **waits** when a collective of its own has been unfinished for a while (the stream
  flags it); the members of that call's group not in it are the ranks it waits for
  (:meth:`WatchResult.waited_for`, where the dumps name the group's members);
- a rank is **stalled** when it made no progress (no new collective, no new step) for
  ``stall_after`` seconds, waits in nothing, and other ranks wait in a collective: they wait
  for it. A rank whose stream ended without a final dump and whose file is no longer touched
  is stalled too (its process is probably gone; the cause is not recorded);
- every live rank waiting for ``stall_after`` seconds, none stalled, is a **hang**
  (``commdebug check`` on the folder says which calls differ);
- members of one group waiting in different calls (another sequence number or op) are
  **apart**: such calls never match, so it is a hang in the making, said before ``stall_after``
  has passed (a wait in the same call is only **waiting**, never called healthy);
- a rank is a **straggler** when it is behind the median step of the ranks still running by at
  least one step and by more than ``behind_pct`` percent (ranks that finished are ahead by
  nature while the others finish);
- a rank **failed** when its final dump says it ended by an error or a signal (not a normal
  exit), or its fault record says a fatal signal ended its process before a final dump (a
  fatal signal after the final dump, gloo's teardown abort, is a note on a finished rank);
- once some rank has finished, a rank with only a stream that has shown no sign of life for
  ``GONE_AFTER_S`` is **gone** (its process ended or lost its node; the cause is not
  recorded): the job ended around it; so is one whose process this host's kernel says has
  ended without a final dump;
- the job is **over** (:attr:`WatchResult.over`) when every rank of the current run has ended:
  by a final dump, or gone. In a reused folder the current run is the newest run id: older
  runs' files are left out.

A rank's step is the step it is in (its stream's) or ended in (its final dump's
``metadata.step``; for dumps written before that key, the step of its last collective).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commdebug.analysis.check_digest import completed_seqs, process_alive
from commdebug.analysis.died_in import Candidate, DiedIn, died_in
from commdebug.model.aggregates import older_of
from commdebug.model.fault import NORMAL_ENDINGS, ending_note
from commdebug.model.presence import Placement, absence, placement_of
from commdebug.model.rank_view import RankView
from commdebug.model.stream import STREAM_SUFFIX
from commdebug.model.trace import CollectiveEvent

if TYPE_CHECKING:
    from commdebug.formats.folders import Dumps

__all__ = ["Call", "RankLive", "WatchResult", "live_state", "watch", "watch_path", "RECENT_STEPS"]

RECENT_STEPS = 3  # steps whose communication is shown
# a live rank's stream is touched every few seconds (docs/streaming.md): this long without a
# sign of life, after other ranks finished, it is gone
GONE_AFTER_S = 10.0
# how a rank's final dump says it ended well (commdebug run's reasons, a context's own exit)


@dataclass
class Call:
    """A collective as the live view names it."""

    op: str
    group: str  # label
    seq: int | None
    module: str | None
    source: str | None
    step: int
    in_flight: bool = False
    since: float | None = None  # wall time it has been unfinished since, when it is
    members: list[int] | None = None  # the group's ranks, where the dump names them

    @classmethod
    def of(cls, e: CollectiveEvent, since: float | None = None) -> Call:
        return cls(e.op, e.group.label, e.seq, e.module if e.module not in ("?", "") else None, e.source, e.step,
                   e.in_flight or since is not None, since, None if e.group.ranks is None else list(e.group.ranks))


@dataclass
class RankLive:
    """One rank now: enough to say whether it moves, never its events."""

    rank: int
    file: str | None
    step: int
    progress: float | None  # wall time of its last new collective or step
    heartbeat: float | None  # wall time its recording was last seen alive (file touched, server answered)
    ended_by: str | None  # set once its final dump is written
    last: Call | None
    waiting: Call | None
    recent: list[tuple[int, int, float | None]] = field(default_factory=list)  # (step, calls, seconds or None)
    hostname: str | None = None
    fault: dict[str, Any] | None = None  # its fault record (metadata.fault): a fatal signal ended its process
    alive: bool | None = None  # its process still runs (False: ended), where this host can tell
    raised_at: dict[str, Any] | None = None  # where its program raised the error its final dump names
    # a rank gone without a final dump: the call the evidence says it was last in (commdebug.analysis.died_in)
    died_in: DiedIn | None = None

    @property
    def crashed(self) -> bool:
        """A fatal signal ended its process before it wrote a final dump."""
        return self.fault is not None and not self.fault.get("after_final_dump") and self.ended_by is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankLive:
        """From :meth:`to_dict`'s form (a rank's answer to the debug server)."""
        d = dict(d)
        d["last"] = Call(**d["last"]) if d.get("last") else None
        d["waiting"] = Call(**d["waiting"]) if d.get("waiting") else None
        d["recent"] = [tuple(r) for r in d.get("recent") or []]
        died = d.get("died_in")
        d["died_in"] = DiedIn(Candidate(**{k: v for k, v in died.items() if k != "fault_line"}), bool(died["fault_line"])) if died else None
        return cls(**d)


def live_state(events: list[CollectiveEvent], *, rank: int, step: int, progress: float | None, heartbeat: float | None,
               in_flight: dict[int, float], ended_by: str | None = None, file: str | None = None,
               hostname: str | None = None, older_steps: dict[int, list] | None = None) -> RankLive:
    """A rank's :class:`RankLive` from its latest events (in call order) and its stream's facts."""
    last = Call.of(events[-1], in_flight.get(events[-1].index)) if events else None
    waiting = None
    if in_flight:  # the oldest of the unfinished ones is what it waits in
        first = min(in_flight)
        waiting = next((Call.of(e, in_flight[e.index]) for e in reversed(events) if e.index == first), None)
    per_step: dict[int, list] = {}
    for e in events:
        if e.step < step - RECENT_STEPS:
            continue
        cell = per_step.setdefault(e.step, [0, None])
        cell[0] += 1
        if e.latency_s is not None:
            cell[1] = (cell[1] or 0.0) + e.latency_s
    for s, totals in (older_steps or {}).items():
        if s >= step - RECENT_STEPS and s not in per_step:
            per_step[s] = [totals[0], totals[3] if totals[2] else None]
    recent = [(s, c, t) for s, (c, t) in sorted(per_step.items())][-RECENT_STEPS:]
    return RankLive(rank, file, step, progress, heartbeat, ended_by, last, waiting, recent, hostname)


def _from_view(view: RankView) -> RankLive:
    meta = view.metadata
    stream = meta.get("stream") or {}
    try:
        heartbeat = os.stat(view.path).st_mtime
    except OSError:
        heartbeat = None
    in_flight = {int(i): float(t) for i, t in (stream.get("in_flight") or {}).items()}
    if not stream:  # a final (or hang) dump: its flags, no times
        in_flight = {e.index: 0.0 for e in view.events if e.in_flight} if meta.get("ended_by") == "hang" else {}
    older = older_of(view)
    ended = meta.get("ended_by")
    state = live_state(view.events, rank=view.rank, step=_step(view), progress=stream.get("progress"), heartbeat=heartbeat,
                       in_flight=in_flight, ended_by=None if ended in (None, "hang") else str(ended), file=str(view.path),
                       hostname=meta.get("hostname"), older_steps=older.steps if older is not None else None)
    fault = meta.get("fault")
    state.fault = fault if isinstance(fault, dict) else None
    raised = meta.get("raised_at")
    state.raised_at = raised if isinstance(raised, dict) else None
    if ended in (None, "hang"):  # no final dump: is its process still there?
        state.alive = process_alive(meta)
    return state


class _Evidence:
    """What the ranks' records say about calls a rank's own record may lack: per group, the
    last call some member's record shows completed, and each rank's own last call there
    (:mod:`commdebug.analysis.died_in`)."""

    def __init__(self) -> None:
        self.done: dict[str, Candidate] = {}  # group name -> the latest call a record shows completed
        self.own: dict[int, dict[str, int]] = {}  # rank -> group name -> its own last seq

    def add(self, view: RankView) -> None:
        mine = self.own.setdefault(view.rank, {})
        for e in view.events:
            if e.seq is not None:
                mine[e.group.name] = max(mine.get(e.group.name, -1), e.seq)
        for name, seq in completed_seqs(view).items():
            known = self.done.get(name)
            if known is not None and known.seq is not None and known.seq >= seq:
                continue
            call = next((e for e in reversed(view.events) if e.group.name == name and e.seq == seq), None)
            if call is not None:
                self.done[name] = Candidate(call.op, call.group.label, seq, call.source,
                                            call.module if call.module not in ("?", "") else None, call.step, view.rank)

    def died_in(self, r: RankLive) -> DiedIn | None:
        """For a rank gone without a final dump: the call the evidence says it was last in."""
        peers = [c for name, last in self.own.get(r.rank, {}).items()
                 if (c := self.done.get(name)) is not None and c.seq is not None and c.seq > last and c.completed_by != r.rank]
        own = None if r.last is None else Candidate(r.last.op, r.last.group, r.last.seq, r.last.source, r.last.module, r.last.step, None)
        return died_in(peers, own, r.fault)


def _step(view: RankView) -> int:
    """The step a rank is in (its stream says) or ended in (its dump's ``step``; ``steps`` is a
    count, one more than the last step's index)."""
    stream, meta = view.metadata.get("stream") or {}, view.metadata
    for value in (stream.get("step"), meta.get("step")):
        if isinstance(value, int):
            return value
    if view.events:  # a dump written before ``step`` was recorded: its last collective's step
        return view.events[-1].step
    return max(int(meta.get("steps") or 0) - 1, 0)


@dataclass
class WatchResult:
    """The job now: each rank's state and the verdict."""

    now: float
    stall_after: float
    behind_pct: float
    ranks: list[RankLive]
    median_step: float | None
    stalled: list[int] = field(default_factory=list)
    stragglers: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)  # ranks whose recording is no longer alive
    failed: list[int] = field(default_factory=list)  # finished by an error or a signal
    hung: bool = False
    apart: list[int] = field(default_factory=list)  # ranks of a group whose members wait in different calls
    notes: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # ranks of the world with no file yet
    elsewhere: list[int] = field(default_factory=list)  # ranks of the world on another node: not in this folder
    running_median_step: float | None = None  # of the ranks still running: what a straggler is behind

    @property
    def over(self) -> bool:
        """Every rank of the run has ended: by a final dump, a fatal signal (its fault record),
        or its recording is gone. A rank with no file yet has not ended."""
        ended = set(self.finished) | set(self.gone) | {r.rank for r in self.ranks if r.crashed}
        return not self.missing and all(r.rank in ended for r in self.ranks)

    @property
    def healthy(self) -> bool:
        return not (self.stalled or self.stragglers or self.hung or self.failed or self.gone or self.apart)

    def rank(self, rank: int) -> RankLive:
        """The state of ``rank``."""
        return next(r for r in self.ranks if r.rank == rank)

    def waited_in(self) -> list[tuple[int, Call]]:
        """(rank, call) of every rank waiting in a collective."""
        return [(r.rank, r.waiting) for r in self.ranks if r.waiting is not None and r.ended_by is None]

    def waited_for(self, call: Call) -> list[RankLive]:
        """The live members of `call`'s group that are not waiting in it: the ranks its waiters
        wait for (none where the dumps do not name the group's members)."""
        if not call.members:
            return []
        inside = {r for r, c in self.waited_in() if (c.group, c.seq, c.op) == (call.group, call.seq, call.op)}
        members = set(call.members)
        return [r for r in self.ranks if r.rank in members and r.rank not in inside and r.ended_by is None]

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "now": self.now, "stall_after": self.stall_after, "behind_pct": self.behind_pct,
                "median_step": self.median_step, "stalled": self.stalled, "stragglers": self.stragglers,
                "waiting": self.waiting, "apart": self.apart, "finished": self.finished, "gone": self.gone, "failed": self.failed, "hung": self.hung,
                "running_median_step": self.running_median_step, "over": self.over, "missing": self.missing,
                "elsewhere": self.elsewhere,
                "notes": self.notes, "ranks": [r.to_dict() for r in self.ranks]}


def watch(ranks: Iterable[RankLive], *, now: float | None = None, stall_after: float = 60.0, behind_pct: float = 10.0) -> WatchResult:
    """The verdict on the ranks' states (see the module docstring)."""
    states = sorted(ranks, key=lambda r: r.rank)
    now = time.time() if now is None else now
    live = [r for r in states if r.ended_by is None and not r.crashed]
    median = statistics.median(r.step for r in states) if states else None
    result = WatchResult(now, stall_after, behind_pct, states, median)
    result.running_median_step = running = statistics.median(r.step for r in live) if live else None
    result.finished = [r.rank for r in states if r.ended_by is not None]
    result.failed = [r.rank for r in states if (r.ended_by is not None and r.ended_by not in NORMAL_ENDINGS) or r.crashed]
    result.waiting = [r.rank for r in live if r.waiting is not None]
    idle = {r.rank: now - r.progress for r in live if r.waiting is None and r.progress is not None}
    if result.waiting:
        result.stalled = sorted(rank for rank, age in idle.items() if age >= stall_after)
    for r in live:
        if r.alive is False:  # its process ended without a final dump
            result.gone.append(r.rank)
        elif r.waiting is None and r.heartbeat is not None and now - r.heartbeat >= stall_after and r.rank in idle:
            result.gone.append(r.rank)  # no heartbeat either: stalled whoever waits
            if r.rank not in result.stalled:
                result.stalled.append(r.rank)
    result.stalled.sort()
    if result.finished or len(live) < len(states):  # the job ended around the ranks still without a final dump
        for r in live:
            seen = max((t for t in (r.heartbeat, r.progress) if t is not None), default=None)
            if r.rank not in result.gone and seen is not None and now - seen >= GONE_AFTER_S:
                result.gone.append(r.rank)
        result.gone.sort()
    waits = [r.waiting for r in live if r.waiting is not None]
    if live and not result.stalled and len(waits) == len(live):
        result.hung = all(now - w.since >= stall_after for w in waits if w.since is not None)
    result.apart = _apart(live)
    if running is not None:
        result.stragglers = [r.rank for r in live if r.rank not in result.stalled
                             and running - r.step >= 1 and running - r.step > running * behind_pct / 100]
    return result


def _apart(live: list[RankLive]) -> list[int]:
    """The ranks waiting in a group whose waiting members are in different calls."""
    by_group: dict[str, dict[tuple[int | None, str], list[int]]] = {}
    for r in live:
        if r.waiting is not None:
            by_group.setdefault(r.waiting.group, {}).setdefault((r.waiting.seq, r.waiting.op), []).append(r.rank)
    return sorted(rank for calls in by_group.values() if len(calls) > 1 for ranks in calls.values() for rank in ranks)


def job_started(path: Dumps) -> bool:
    """True once ``path`` (a folder, a folder of per-node folders, or several folders) holds a
    rank file with at least one whole line (a stream's header, or a dump): what ``watch`` waits
    for before its first frame."""
    from commdebug.errors import DumpError
    from commdebug.formats.folders import rank_files

    try:
        return any(_has_a_line(f) for f in rank_files(path, live=True))
    except DumpError:  # no folder, or no rank file in it, yet
        return False


def _has_a_line(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b"\n" in f.read(1 << 16) or path.suffix != STREAM_SUFFIX
    except OSError:
        return False


def watch_path(path: Dumps, *, now: float | None = None, stall_after: float = 60.0,
               behind_pct: float = 10.0) -> WatchResult:
    """:func:`watch` over a folder of rank streams and dumps (whatever each rank wrote so far), of
    the newest run only (:func:`current_run`); a folder of per-node folders, or several folders,
    are one job. Ranks of the world with no file here are ``missing`` while the dumps present
    place them on a host of this folder (they have not streamed yet), and ``elsewhere`` (not in
    this folder: never waited for) when they place them on another node
    (:mod:`commdebug.model.presence`)."""
    from commdebug.formats.folders import dumps_name, find_job, rank_from_name
    from commdebug.formats.readers import load_rank

    job = find_job(path, live=True, one_run=False)
    files, earlier = current_run(job.files)
    states, notes, world = [], [], 0
    placements: dict[int, Placement] = {}
    starting: list[int] = []  # ranks whose stream was just created: here, not there yet
    evidence = _Evidence()
    for f in files:
        if not _has_a_line(f):
            starting.append(rank_from_name(f))
            continue
        view = load_rank(f)
        states.append(_from_view(view))
        placements[view.rank] = placement_of(view.metadata)
        evidence.add(view)
        notes += [f"rank {view.rank}: {n}" for n in view.notes if "cut short" in n]
        fault = view.metadata.get("fault")
        if isinstance(fault, dict) and fault.get("after_final_dump"):  # gloo's teardown abort: the rank finished
            notes.append(f"rank {view.rank}: {ending_note(view.metadata)}")
        world = max(world, int(view.metadata.get("world_size") or 0))
    if not states:
        from commdebug.errors import DumpError

        raise DumpError(f"{dumps_name(path)}: no rank has streamed a whole line yet (the job is starting)")
    result = watch(states, now=now, stall_after=stall_after, behind_pct=behind_pct)
    for r in result.ranks:  # a rank that ended without a final dump: what the others' records add
        if r.crashed or r.rank in result.gone:
            r.died_in = evidence.died_in(r)
    away = absence(world, placements, job.scope, starting)
    result.elsewhere = list(away.elsewhere)
    result.missing = list(away.here)
    said = away.note()
    if said is not None:
        result.notes.append(said)
    if result.missing:
        result.notes.append(f"no stream yet from rank{'s' if len(result.missing) > 1 else ''} {', '.join(map(str, result.missing))}")
    if earlier:
        names = ", ".join(f.name for f in earlier[:4]) + (f" and {len(earlier) - 4} more" if len(earlier) > 4 else "")
        result.notes.append(f"left out {len(earlier)} file{'s' if len(earlier) != 1 else ''} of an earlier run: {names}")
    result.notes += notes
    return result


def current_run(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(the files of the newest run, the files of earlier runs): a folder reused by a new launch
    still holds the old launch's final dumps of ranks the new one has not reached (or does not
    have). The newest run is the run id of the file written last; files with no run id (Flight
    Recorder, a stream whose header predates the process group) belong to any run."""
    from commdebug.formats.readers import run_id_of

    runs: list[tuple[Path, str | None, float]] = []
    for f in files:
        try:
            mtime = f.stat().st_mtime
        except OSError:
            continue  # gone meanwhile
        runs.append((f, run_id_of(f), mtime))
    known = [(mtime, run) for _, run, mtime in runs if run is not None]
    if len({run for _, run in known}) < 2:
        return [f for f, _, _ in runs], []
    newest = max(known)[1]
    return [f for f, run, _ in runs if run in (None, newest)], [f for f, run, _ in runs if run not in (None, newest)]
