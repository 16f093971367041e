"""The prediction: time = latency + S x busbw factor / bandwidth of the slowest link the group
crosses, with the same S and factor each event already carries (commdebug/ops.py), so a
predicted busbw compares directly with a measured one.

A group inside one node gets the intra-node link. A group spanning nodes gets the network: its
latency, and k x the per-GPU network busbw, where k is the fewest of its ranks on any one node
(a ring of k ranks per node uses k NICs per node), at most the intra-node busbw when k > 1 (the
ring also crosses NVLink). send/recv: by whether the peer is on the recording rank's node.
Ranks map to nodes by consecutive blocks of ``ranks_per_node`` (default: the cluster's
``gpus_per_node``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from commdebug.estimate.cluster import Cluster, ClusterError, Link
from commdebug.estimate.presets import load_cluster
from commdebug.model.trace import CollectiveEvent, Trace

__all__ = ["Prediction", "predict", "predict_events", "predict_trace", "resolve_cluster", "link_for"]

NOTE_NO_RANKS = "some groups have no recorded ranks: assumed consecutive ranks 0..size-1"
NOTE_NO_SIZE = "some calls are on a group of unknown size: not predicted"


@dataclass
class Prediction:
    """Predicted seconds per event (``None``: cannot be predicted) and what was assumed."""

    cluster: Cluster
    seconds: list[float | None]
    notes: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(s for s in self.seconds if s is not None)


def link_for(cluster: Cluster, ranks: Iterable[int], ranks_per_node: int) -> tuple[Link, float]:
    """The link a group of global ranks crosses and its effective busbw in GB/s."""
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[r // ranks_per_node] = per_node.get(r // ranks_per_node, 0) + 1
    if len(per_node) <= 1:
        return cluster.intra_node, cluster.intra_node.busbw_gbps
    k = min(per_node.values())
    bw = cluster.network.busbw_gbps * k
    if k > 1:
        bw = min(bw, cluster.intra_node.busbw_gbps)
    return cluster.network, bw


def predict_events(events: Iterable[CollectiveEvent], cluster: Cluster, *, rank: int = 0,
                   ranks_per_node: int | None = None) -> Prediction:
    """Predicted seconds of each event, in order. ``rank``: the recording rank (for send/recv)."""
    rpn = ranks_per_node or cluster.gpus_per_node
    pred = Prediction(cluster, [])
    cache: dict[tuple, tuple[Link, float]] = {}
    notes: set[str] = set()
    for e in events:
        group = e.group
        if e.peer is not None:  # send/recv: this rank and its peer
            key: tuple = ("p2p", rank // rpn == e.peer // rpn)
            ranks: tuple[int, ...] = (rank, e.peer)
        elif group.size <= 0 and group.ranks is None:
            pred.seconds.append(None)
            notes.add(NOTE_NO_SIZE)
            continue
        else:
            ranks = group.ranks if group.ranks is not None else tuple(range(group.size))
            if group.ranks is None:
                notes.add(NOTE_NO_RANKS)
            key = ("group", group.name, ranks)
        if len(set(ranks)) <= 1:  # a group of one moves nothing
            pred.seconds.append(0.0)
            continue
        got = cache.get(key)
        if got is None:
            got = cache[key] = link_for(cluster, ranks, rpn)
        link, bw = got
        pred.seconds.append(link.latency_us * 1e-6 + e.size_bytes * e.busbw_factor / (bw * 1e9))
    pred.notes = sorted(notes)
    return pred


def resolve_cluster(override: Any, metadata: Mapping[str, Any]) -> Cluster | None:
    """The cluster to predict on: ``override`` (a preset name, cluster file, dict or Cluster) when
    given, else the dump's own ``metadata["cluster"]``, else None (nothing to predict on)."""
    spec = override if override is not None else metadata.get("cluster")
    return None if spec is None else load_cluster(spec)


def predict_trace(trace: Trace, cluster: Any = None, *, ranks_per_node: int | None = None) -> Prediction | None:
    """The prediction of every kept event of ``trace`` on ``cluster`` (default: the trace's own
    ``metadata.cluster``), recorded on the trace's rank; None when there is no cluster."""
    resolved = resolve_cluster(cluster, trace.metadata)
    if resolved is None:
        return None
    return predict_events(trace.events, resolved, rank=int(trace.metadata.get("rank") or 0), ranks_per_node=ranks_per_node)


def predict(trace_or_events: Trace | Iterable[CollectiveEvent], cluster: Any = None, *,
            ranks_per_node: int | None = None) -> list[float | None]:
    """Predicted seconds of every kept event of a trace (or of events, recorded on rank 0), in
    order: each event's ``predicted_s``. ``cluster`` defaults to the trace's ``metadata.cluster``.

    >>> predict(commdebug.load("plan.json"), "h100-ib400")[:2]   # doctest: +SKIP
    [1.2e-05, 0.0031]
    """
    if isinstance(trace_or_events, Trace):
        prediction = predict_trace(trace_or_events, cluster, ranks_per_node=ranks_per_node)
        if prediction is None:
            raise ClusterError("no cluster to predict on: pass one (a preset name or cluster file); this trace has no metadata.cluster")
        return prediction.seconds
    if cluster is None:
        raise ClusterError("no cluster to predict on: pass one (a preset name or cluster file)")
    return predict_events(trace_or_events, load_cluster(cluster), ranks_per_node=ranks_per_node).seconds
