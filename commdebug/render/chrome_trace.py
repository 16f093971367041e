"""Chrome Trace Event JSON of a job's collectives: ``commdebug trace traces/ -o trace.json``,
for Perfetto (ui.perfetto.dev) and chrome://tracing.

- one process per rank (``pid`` = rank), named ``rank R (host)``;
- a track (``tid``) per process group, named by its label, plus a ``steps`` track with one
  span per training step;
- timed collectives are complete events (``ph: X``, ``ts`` and ``dur`` in microseconds) with
  op, bytes, group, module, seq and busbw in ``args``; untimed ones are instant events
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
  with no recorded time are on it. Measured tracks never carry predicted spans.

Timestamps count from each rank's own start (entering CommDebugMode): clocks of different hosts
are not aligned, and ranks do not start at the same instant, so compare durations across ranks,
not positions.

:class:`ChromeTrace` renders the ranks as text chunks, one event each, for
:func:`commdebug.fileio.write_output`: a thousand ranks need not fit in memory.

    >>> chrome = ChromeTrace(cluster="h100-ib400")
    >>> write_output("trace.json", chrome.render(iter_ranks("traces/")))   # doctest: +SKIP
    >>> chrome.counts["complete"]                                           # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from commdebug.estimate import Cluster, predict_events, resolve_cluster
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent

__all__ = ["ChromeTrace", "rank_trace_events"]

_US = 1e6


def rank_trace_events(view: RankView, cluster: Cluster | None = None) -> Iterable[dict[str, Any]]:
    """The trace events of one rank, metadata first; then its predicted track when ``cluster``
    (default: the rank's ``metadata.cluster``) is known."""
    pid = view.rank
    host = view.metadata.get("hostname")
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}" + (f" ({host})" if host else "")}}
    yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
    yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "steps"}}
    lanes: dict[str, list[float]] = {}  # group label -> end time of the last event on each lane
    tids: dict[tuple[str, int], int] = {}
    steps: dict[int, list[float]] = {}
    for e in view.events:
        if e.start_s is None:
            continue
        ts = e.start_s * _US
        dur = (e.latency_s or 0.0) * _US
        label = e.group.label
        ends = lanes.setdefault(label, [])
        lane = next((i for i, end in enumerate(ends) if end <= ts), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = ts + dur
        tid = tids.get((label, lane))
        if tid is None:
            tid = tids[(label, lane)] = len(tids) + 1
            name = label if lane == 0 else f"{label} ({lane + 1})"
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        span = steps.setdefault(e.step, [ts, ts + dur])
        span[0], span[1] = min(span[0], ts), max(span[1], ts + dur)
        if e.latency_s is not None:
            yield {"ph": "X", "name": e.op, "cat": "collective", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": _args(e)}
        else:
            yield {"ph": "i", "s": "t", "name": e.op, "cat": "collective", "pid": pid, "tid": tid, "ts": ts, "args": _args(e)}
    spans = sorted(steps.items())
    for i, (step, (start, end)) in enumerate(spans):
        if i + 1 < len(spans):  # a step's last collective may finish after the next one began
            end = min(end, spans[i + 1][1][0])
        yield {"ph": "X", "name": f"step {step}", "cat": "step", "pid": pid, "tid": 0, "ts": start, "dur": max(end - start, 0.0), "args": {"step": step}}
    resolved = resolve_cluster(cluster, view.metadata)
    if resolved is not None:
        yield from _predicted_track(view, resolved, len(tids) + 1)


def _predicted_track(view: RankView, cluster: Cluster, tid: int) -> Iterable[dict[str, Any]]:
    """The rank's calls at their predicted durations, back to back from 0 on their own track."""
    pid = view.rank
    yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"predicted on {cluster.name}"}}
    yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
    ts = 0.0
    prediction = predict_events(view.events, cluster, rank=view.rank)
    for e, seconds in zip(view.events, prediction.seconds):
        if seconds is None:
            continue
        dur = seconds * _US
        args = _args(e, with_busbw=False)
        args.update(predicted=True, cluster=cluster.name, predicted_ms=round(seconds * 1e3, 6))
        yield {"ph": "X", "name": e.op, "cat": "predicted", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        ts += dur


def _args(e: CollectiveEvent, with_busbw: bool = True) -> dict[str, Any]:
    # a predicted span leaves the measured busbw out, so nothing measured sits on it
    args: dict[str, Any] = {"op": e.op, "bytes": e.size_bytes, "group": e.group.label, "module": e.module, "phase": e.phase, "step": e.step}
    if e.seq is not None:
        args["seq"] = e.seq
    if e.peer is not None:
        args["peer"] = e.peer
    if with_busbw and e.busbw_gbps is not None:
        args["busbw_gbps"] = round(e.busbw_gbps, 3)
    if e.source:
        args["source"] = e.source
    if e.in_flight:
        args["in_flight"] = True
    if e.unit is not None:
        args["unit"] = e.unit
    if e.error is not None:
        args["error"] = e.error
    return args


class ChromeTrace:
    """The Chrome Trace renderer: ``render(views)`` yields the JSON text of the ranks' events;
    ``counts`` then says what it held (ranks, complete, instant, predicted events, and calls
    without a recorded time, skipped).

    ``cluster`` (a preset name, cluster file, dict or :class:`~commdebug.estimate.Cluster`)
    adds every rank's predicted track on it; without it, ranks whose dump stored a cluster get
    theirs.
    """

    def __init__(self, cluster: Any = None) -> None:
        self.cluster = None if cluster is None else resolve_cluster(cluster, {})
        self.counts = {"ranks": 0, "complete": 0, "instant": 0, "skipped": 0, "predicted": 0}

    def render(self, views: Iterable[RankView]) -> Iterator[str]:
        counts = self.counts
        yield '{"displayTimeUnit":"ms","traceEvents":[\n'
        separator = ""
        for view in views:
            counts["ranks"] += 1
            counts["skipped"] += sum(1 for e in view.events if e.start_s is None)
            for event in rank_trace_events(view, self.cluster):
                if event["ph"] == "X" and event.get("cat") == "collective":
                    counts["complete"] += 1
                elif event["ph"] == "X" and event.get("cat") == "predicted":
                    counts["predicted"] += 1
                elif event["ph"] == "i":
                    counts["instant"] += 1
                yield separator + json.dumps(event, separators=(",", ":"))
                separator = ",\n"
        yield "\n]}\n"
