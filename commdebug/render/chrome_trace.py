"""Chrome Trace Event JSON of a job's collectives: ``commdebug trace traces/ -o trace.json``,
for Perfetto (ui.perfetto.dev) and chrome://tracing.

- one process per rank (``pid`` = rank), named ``rank R (host)``;
- a track (``tid``) per process group, named by its label, plus a ``steps`` track with one
  span per training step;
- timed collectives are complete events (``ph: X``, ``ts`` and ``dur`` in microseconds) with
  op, bytes, group, module, seq and busbw in ``args`` (bytes and busbw null where the trace does
  not give a size or a group size; group and module "unknown" where it names none); untimed ones are instant events
  (``ph: i``) at the time they were called;
- complete events on one track never partially overlap: a call that overlaps the one before it
  on its group's track (asynchronous timing can do that) goes to a second lane of that group;
- with a cluster (the dump's ``metadata.cluster``, or ``cluster=`` / ``--cluster``, which
  overrides it), one more track per rank, ``predicted on <cluster>``, holds each call's
  predicted time (docs/estimate.md) as complete events with ``args.predicted: true``. They are
  laid back to back in call order from the rank's time 0, not at the calls' recorded times: a
  prediction says how long, not when (the recorded times are the recording machine's, often a
  laptop with the fake backend), and the track's length is then the predicted communication
  time as the model adds it up (serially). Calls of unknown group size are left off it; calls
  with no recorded time are on it. Measured tracks never carry predicted spans;
- flows (``ph`` ``s``/``t``/``f``, Chrome trace flow events) link the timed calls of one
  collective, the same (group name, sequence number), across the ranks in the trace, for the
  ops no member can finish before every member joined (all_reduce, all_gather, reduce_scatter,
  all_to_all, barrier: a broadcast's root may leave before the others arrive): Perfetto
  draws an arrow from the rank that arrived first to the one that arrived last. Arrival is told
  by latency (the first to arrive waited longest, the last waited least), which needs no
  clock; each arrow's point on a call is where that rank was known to be inside it: its start,
  or the previous point when that is later (every member is inside a blocking call when the
  last one joins), so on one clock the arrows run forward, and across hosts back by no more
  than their clocks' error;
- ``steps=`` keeps only those steps' calls; the ranks to show are the views passed in (see
  :func:`commdebug.formats.selection.iter_selected`). ``counts`` says what was written and what
  was left out, and why.

Every rank is on one clock when ``clocks`` is given (:mod:`commdebug.analysis.clocks`: each
dump's wall-clock start, refined where members of a blocking collective finish it together):
``ts`` is microseconds from the job's earliest aligned start, and the trace's ``metadata``
(``commdebug_clocks``) keeps each host's estimated offset and each rank's shift. Without it
each rank counts from its own start (entering CommDebugMode).

:class:`ChromeTrace` renders the ranks as text chunks, one event each, for
:func:`commdebug.fileio.write_output`: a thousand ranks need not fit in memory.

    >>> chrome = ChromeTrace(cluster="h100-ib400")
    >>> write_output("trace.json", chrome.render(iter_ranks("traces/")))   # doctest: +SKIP
    >>> chrome.counts["complete"]                                           # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from commdebug.analysis.clocks import Clocks
from commdebug.estimate import Cluster, predict_events, resolve_cluster
from commdebug.model.aggregates import older_of
from commdebug.model.rank_view import RankView
from commdebug.model.trace import UNKNOWN_LABEL, CollectiveEvent
from commdebug.ops import needs_all
from commdebug.units import format_duration, who

__all__ = ["ChromeTrace", "RankChunk", "rank_chunk", "rank_trace_events", "trace_summary", "clock_lines"]

_US = 1e6
# flow events of one chain share their category, name and id (how Perfetto joins them)
_FLOW_CAT, _FLOW_NAME = "collective", "collective"
_CLOCKS_SHOWN = 8  # clocks (hosts) printed one per line; the trace's metadata keeps every one
_INSIDE_US = 0.001  # a flow point this far inside its call's span (a nanosecond: the file's resolution)


def _us(seconds: float) -> float:
    # nanosecond resolution: a full float repeats 17 digits per time in a file of millions
    return round(seconds * _US, 3)


class _Flows:
    """Where each timed call of a collective landed in the trace, per group, in flat arrays
    (a thousand ranks' calls in tens of bytes each), to chain once every rank is written."""

    def __init__(self) -> None:
        self.groups: dict[str, tuple[array, array, array, array, array]] = {}
        self.chains = 0

    def add(self, group: str, seq: int, pid: int, tid: int, ts: float, latency: float) -> None:
        cols = self.groups.get(group)
        if cols is None:
            cols = self.groups[group] = (array("q"), array("q"), array("q"), array("d"), array("d"))
        seqs, pids, tids, starts, latencies = cols
        seqs.append(seq)
        pids.append(pid)
        tids.append(tid)
        starts.append(ts)
        latencies.append(latency)

    def merge(self, other: _Flows) -> None:
        """Another rank's calls, after this one's."""
        for group, theirs in other.groups.items():
            cols = self.groups.get(group)
            if cols is None:
                self.groups[group] = theirs
                continue
            for mine, more in zip(cols, theirs, strict=True):
                mine.extend(more)

    def events(self) -> Iterator[dict[str, Any]]:
        """One chain per (group, seq) timed on two ranks or more: start on the rank that waited
        longest (it arrived first), a step on each rank after it, the end on the one that
        waited least. Each point sits inside its call's span, at its start or the previous
        point if later (never past its end), and binds to it (``bp: e``)."""
        flow_id = 0
        for group in sorted(self.groups):
            seqs, pids, tids, starts, latencies = self.groups.pop(group)
            by_seq: dict[int, list[int]] = {}
            for i, seq in enumerate(seqs):
                by_seq.setdefault(seq, []).append(i)
            for seq in sorted(by_seq):
                calls = by_seq[seq]
                if len({pids[i] for i in calls}) < 2:
                    continue
                flow_id += 1
                self.chains += 1
                calls.sort(key=lambda i: (-latencies[i], pids[i]))
                last = len(calls) - 1
                at = -math.inf
                for k, i in enumerate(calls):
                    ph = "s" if k == 0 else "f" if k == last else "t"
                    begin, end = starts[i], starts[i] + latencies[i] * _US
                    inside = _INSIDE_US if end - begin > 2 * _INSIDE_US else 0.0  # strictly within its span: binds to it
                    at = min(max(at, begin + inside), end - inside)
                    yield {"ph": ph, "bp": "e", "cat": _FLOW_CAT, "name": _FLOW_NAME, "id": flow_id, "pid": pids[i],
                           "tid": tids[i], "ts": round(at, 3)}


def rank_trace_events(view: RankView, cluster: Cluster | None = None, *, flows: _Flows | None = None,
                      steps: Any = None, shift_s: float = 0.0) -> Iterable[dict[str, Any]]:
    """The trace events of one rank, metadata first; then its predicted track when ``cluster``
    (default: the rank's ``metadata.cluster``) is known. ``steps`` (a container of step
    numbers) keeps only those steps' calls; ``flows`` collects where timed calls landed;
    ``shift_s`` puts the rank's own times on the job's clock (:class:`Clocks`)."""
    pid = view.rank
    host = view.metadata.get("hostname")
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}" + (f" ({host})" if host else "")}}
    yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
    yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "steps"}}
    lanes: dict[str, list[float]] = {}  # group label -> end time of the last event on each lane
    tids: dict[tuple[str, int], int] = {}
    span_of: dict[int, list[float]] = {}
    labels: dict[Any, str] = {}  # a group's label, worked out once per group, not per call
    events = view.events if steps is None else [e for e in view.events if e.step in steps]
    for e in events:
        if e.start_s is None:
            continue
        ts = _us(e.start_s + shift_s)
        end = _us(e.start_s + shift_s + (e.latency_s or 0.0))
        label = labels.get(e.group)
        if label is None:
            label = labels[e.group] = e.group.label
        ends = lanes.setdefault(label, [])
        lane = next((i for i, last in enumerate(ends) if last <= ts), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = end
        tid = tids.get((label, lane))
        if tid is None:
            tid = tids[(label, lane)] = len(tids) + 1
            name = label if lane == 0 else f"{label} ({lane + 1})"
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        span = span_of.setdefault(e.step, [ts, end])
        span[0], span[1] = min(span[0], ts), max(span[1], end)
        if e.latency_s is not None:
            yield {"ph": "X", "name": e.op, "cat": "collective", "pid": pid, "tid": tid, "ts": ts, "dur": round(end - ts, 3), "args": _args(e)}
            if flows is not None and e.seq is not None and needs_all(e.op):
                flows.add(e.group.name, e.seq, pid, tid, ts, e.latency_s)
        else:
            yield {"ph": "i", "s": "t", "name": e.op, "cat": "collective", "pid": pid, "tid": tid, "ts": ts, "args": _args(e)}
    spans = sorted(span_of.items())
    for i, (step, (start, end)) in enumerate(spans):
        if i + 1 < len(spans):  # a step's last collective may finish after the next one began
            end = min(end, spans[i + 1][1][0])
        yield {"ph": "X", "name": f"step {step}", "cat": "step", "pid": pid, "tid": 0, "ts": start, "dur": round(max(end - start, 0.0), 3), "args": {"step": step}}
    resolved = resolve_cluster(cluster, view.metadata)
    if resolved is not None:
        yield from _predicted_track(view, resolved, len(tids) + 1, events, _us(shift_s))


def _predicted_track(view: RankView, cluster: Cluster, tid: int, events: list[CollectiveEvent], ts: float) -> Iterable[dict[str, Any]]:
    """The rank's calls at their predicted durations, back to back from its start (`ts`) on their own track."""
    pid = view.rank
    yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"predicted on {cluster.name}"}}
    yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
    prediction = predict_events(events, cluster, rank=view.rank)
    for e, seconds in zip(events, prediction.seconds, strict=True):
        if seconds is None:
            continue
        dur = seconds * _US
        args = _args(e, with_busbw=False)
        args.update(predicted=True, cluster=cluster.name, predicted_ms=round(seconds * 1e3, 6))
        yield {"ph": "X", "name": e.op, "cat": "predicted", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        ts += dur


def _args(e: CollectiveEvent, with_busbw: bool = True) -> dict[str, Any]:
    # a predicted span leaves the measured busbw out, so nothing measured sits on it
    # bytes: null where the size is not known (never 0); a module the data does not name is a word
    args: dict[str, Any] = {"op": e.op, "bytes": e.size_bytes, "group": e.group.label,
                            "module": UNKNOWN_LABEL if e.module in ("?", "") else e.module, "phase": e.phase, "step": e.step}
    if e.seq is not None:
        args["seq"] = e.seq
    if e.peer is not None:
        args["peer"] = e.peer
    if with_busbw and e.latency_s:  # timed: its busbw, null where its size or its group's is not known
        busbw = e.busbw_gbps
        args["busbw_gbps"] = None if busbw is None else round(busbw, 3)
    if e.source:
        args["source"] = e.source
    if e.in_flight:
        args["in_flight"] = True
    if e.unit is not None:
        args["unit"] = e.unit
    if e.error is not None:
        args["error"] = e.error
    return args


@dataclass
class RankChunk:
    """One rank's part of a trace: its events' JSON text (one line, no brackets), what it
    counted, and where its timed calls landed (for the flows). Small and picklable: worker
    processes make them (:attr:`ChromeTrace.digest`) and the writer only joins them."""

    text: str
    counts: dict[str, int]
    flows: _Flows | None


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def rank_chunk(view: RankView, cluster: Cluster | None = None, steps: Any = None, flows: bool = True,
               shifts: dict[int, float] | None = None) -> RankChunk:
    """One rank's :class:`RankChunk`: its events as :func:`rank_trace_events` gives them, encoded;
    ``shifts``: each rank's shift onto the job's clock (:attr:`Clocks.shift_s`)."""
    counts = {"ranks": 1, "complete": 0, "instant": 0, "skipped": 0, "predicted": 0, "outside_steps": 0, "totals_only": 0}
    kept = view.events if steps is None else [e for e in view.events if e.step in steps]
    counts["outside_steps"] = len(view.events) - len(kept)
    counts["skipped"] = sum(1 for e in kept if e.start_s is None)
    older = older_of(view)
    if older is not None:
        counts["totals_only"] = sum(s[0] for step, s in older.steps.items() if steps is None or step in steps)
    mine = _Flows() if flows else None
    chunk = list(rank_trace_events(view, cluster, flows=mine, steps=steps, shift_s=(shifts or {}).get(view.rank, 0.0)))
    for event in chunk:
        if event["ph"] == "X":
            cat = event.get("cat")
            if cat == "collective":
                counts["complete"] += 1
            elif cat == "predicted":
                counts["predicted"] += 1
        elif event["ph"] == "i":
            counts["instant"] += 1
    # one rank's events encoded in one call, one line: per event costs twice as much
    return RankChunk(_ENCODE(chunk)[1:-1] if chunk else "", counts, mine)


class ChromeTrace:
    """The Chrome Trace renderer: ``render(views)`` yields the JSON text of the ranks' events;
    ``counts`` then says what it held: ``ranks``, ``complete``, ``instant``, ``predicted``,
    ``flows`` (chains, one per collective call timed on two ranks or more) and ``flow_events``
    written; calls left out because they have no recorded start (``skipped``), lie outside
    ``steps`` (``outside_steps``), or were kept as totals only (``totals_only``: the older steps
    of a ``--keep-steps`` run, or beyond ``max_events``; a trace needs each call).

    ``cluster`` (a preset name, cluster file, dict or :class:`~commdebug.estimate.Cluster`)
    adds every rank's predicted track on it; without it, ranks whose dump stored a cluster get
    theirs. ``steps`` (a container of step numbers, e.g. a
    :class:`~commdebug.formats.selection.Selection`; None: all) keeps only those steps' calls.
    ``flows=False`` leaves the flow arrows out. ``clocks``
    (:func:`~commdebug.analysis.clocks.align_clocks` of the same ranks) puts every rank on one
    clock and goes into the trace's ``metadata``; without it each rank counts from its own start.
    """

    def __init__(self, cluster: Any = None, *, steps: Any = None, flows: bool = True, clocks: Clocks | None = None) -> None:
        self.cluster = None if cluster is None else resolve_cluster(cluster, {})
        self.steps = steps
        self.flows = flows
        self.clocks = clocks
        self.counts = {"ranks": 0, "complete": 0, "instant": 0, "skipped": 0, "predicted": 0, "flows": 0,
                       "flow_events": 0, "outside_steps": 0, "totals_only": 0}

    @property
    def digest(self) -> Callable[[RankView], RankChunk]:
        """The function that turns one rank into its :class:`RankChunk` for this trace: pass it
        as ``read_all(..., digest=)`` so worker processes write the ranks' events."""
        return partial(rank_chunk, cluster=self.cluster, steps=self.steps, flows=self.flows,
                       shifts=None if self.clocks is None else self.clocks.shift_s)

    def render(self, views: Iterable[RankView | RankChunk]) -> Iterator[str]:
        """The trace's JSON text, a rank at a time: each rank as its view or its
        :class:`RankChunk` (made by :attr:`digest`, maybe in a worker process)."""
        counts = self.counts
        flows = _Flows() if self.flows else None
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        yield '{"displayTimeUnit":"ms","traceEvents":[\n'
        separator = ""
        for view in views:
            part = view if isinstance(view, RankChunk) else self.digest(view)
            for key, n in part.counts.items():
                counts[key] += n
            if flows is not None and part.flows is not None:
                flows.merge(part.flows)
            if part.text:
                yield separator + part.text
                separator = ",\n"
        if flows is not None:
            chunk = []
            for event in flows.events():
                chunk.append(event)
                if len(chunk) == 10_000:  # a million arrows need not sit in memory at once
                    counts["flow_events"] += len(chunk)
                    yield separator + dumps(chunk)[1:-1]
                    separator, chunk = ",\n", []
            if chunk:
                counts["flow_events"] += len(chunk)
                yield separator + dumps(chunk)[1:-1]
            counts["flows"] = flows.chains
        clocks = "" if self.clocks is None else ',"metadata":{"commdebug_clocks":' + dumps(self.clocks.to_dict()) + "}"
        yield "\n]" + clocks + "}\n"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def clock_lines(clocks: Clocks) -> list[str]:
    """How the ranks were put on one clock, and how well: what ``commdebug trace`` prints."""
    if clocks.method == "own starts":
        return ["clocks: not aligned (a dump has no wall-clock start): each rank counts from its own start"]
    precise = "its start time" if clocks.per == "host" else "its start time (to the millisecond: a dump from before start_wall_s)"
    if clocks.per == "host" and len(clocks.clocks) == 1:  # one host, one clock: the starts place every rank exactly
        return [f"clocks: one clock for all ranks: every rank on {_clock_name(clocks.clocks[0], 'host')}, placed by its start time"]
    if clocks.method == "start times":
        if clocks.gpu_timed:
            why = (f"the calls of {who(clocks.gpu_timed)} were timed on a GPU (their start is the host's issue, their "
                   "length the kernel's, which may have run later), and such a span does not bound a host's clock")
        else:
            why = "record with --timing"
        return [f"clocks: each rank placed by {precise}; no blocking call was timed on two "
                f"{'hosts' if clocks.per == 'host' else 'ranks'} to check or refine it ({why})"]
    reference = clocks.clocks[0]
    lines = [f"clocks: one clock for all ranks: each rank placed by {precise}, each "
             f"{clocks.per}'s clock bounded and refined by {_n(clocks.calls, 'blocking call')} timed on several "
             f"{clocks.per}s (against {_clock_name(reference, clocks.per)})"]
    others = clocks.clocks[1:]
    for c in others[:_CLOCKS_SHOWN]:
        sign = "+" if c.offset_s >= 0 else "-"
        if c.low_s is None or c.high_s is None:
            how = "no call shared: its start time alone"
        elif c.low_s > c.high_s:
            how = (f"the calls' bounds disagree by {format_duration(c.low_s - c.high_s)} (a clock stepped during the run, or "
                   f"times that are not comparable): placed where the ends of its {_n(c.calls, 'call')} agree")
        else:
            how = f"± {format_duration(c.uncertainty_s)} (bounded by {_n(c.calls, 'call')})"
        lines.append(f"  {_clock_name(c, clocks.per)}: {sign}{format_duration(abs(c.offset_s))}, {how}")
    if len(others) > _CLOCKS_SHOWN:
        rest = others[_CLOCKS_SHOWN:]
        worst = max((c.uncertainty_s for c in rest if c.uncertainty_s is not None), default=None)
        odd = sum(1 for c in rest if c.low_s is not None and c.high_s is not None and c.low_s > c.high_s)
        lines.append(f"  ... {len(rest):,} more {clocks.per}s"
                     + ("" if worst is None else f", the bounded ones within ± {format_duration(worst)}")
                     + (f", {odd:,} whose calls' bounds disagree" if odd else "")
                     + " (the trace's metadata.commdebug_clocks lists every one)")
    return lines


def _clock_name(c: Any, per: str) -> str:
    """"host node1 (ranks 2-3)", or a rank's own clock: "rank 3 (node1)"."""
    if per == "host":
        return f"host {c.host or '?'} ({who(c.ranks)})"
    return who(c.ranks) + (f" ({c.host})" if c.host else "")


def trace_summary(counts: dict[str, int], out: Any, *, ranks_in_folder: int | None = None, ranks: str = "all",
                  steps: str = "all", clocks: Clocks | None = None) -> list[str]:
    """What ``commdebug trace`` prints once written: the events written, how the ranks were put
    on one clock, then (only when some were) what was left out and why. `counts` is
    :attr:`ChromeTrace.counts`."""
    timed = f"{counts['complete']:,} timed collectives, {counts['instant']:,} untimed (instant events)"
    if counts["predicted"]:
        timed += f", {counts['predicted']:,} predicted spans"
    if counts.get("flows"):
        timed += f", {_n(counts['flows'], 'flow')} joining the ranks of one call"
    lines = [f"wrote {out}: {_n(counts['ranks'], 'rank')}, {timed}; open it in https://ui.perfetto.dev"]
    if clocks is not None:
        lines += clock_lines(clocks)
    left = []
    if ranks_in_folder is not None and ranks_in_folder > counts["ranks"]:
        left.append(f"{ranks_in_folder - counts['ranks']:,} of {ranks_in_folder:,} ranks (not in --ranks {ranks})")
    if counts.get("outside_steps"):
        left.append(f"{_n(counts['outside_steps'], 'call')} outside --steps {steps}")
    if counts.get("skipped"):
        left.append(f"{_n(counts['skipped'], 'call')} with no recorded start time")
    if counts.get("totals_only"):
        left.append(f"{_n(counts['totals_only'], 'call')} of older steps kept as totals only (keep_steps, max_events)")
    if left:
        lines.append("left out: " + "; ".join(left))
    return lines
