"""The prediction. On a cluster with measured curves (``commdebug calibrate`` on timed dumps or
nccl-tests output), an op's time follows its curve (commdebug/estimate/curves.py: measured
points, log-log interpolation, step-count extrapolation to other group sizes). Otherwise, and
for ops no curve covers: time = latency + S x busbw factor / bandwidth of the slowest link the
group crosses, with the same S and factor each event carries (commdebug/ops.py), so a predicted
busbw compares directly with a measured one.

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

from commdebug import ops
from commdebug.estimate.cluster import Cluster, ClusterError
from commdebug.estimate.curves import Curve, Where, nearest, scaled
from commdebug.estimate.presets import load_cluster
from commdebug.model.trace import CollectiveEvent, Trace

__all__ = ["Prediction", "predict", "predict_events", "predict_trace", "resolve_cluster", "effective_size"]

NOTE_NO_RANKS = "some groups have no recorded ranks: assumed consecutive ranks 0..size-1"
NOTE_NO_SIZE = "some calls are on a group of unknown size: not predicted"
NOTE_NO_BYTES = "some calls have no recorded message size (a trace without shapes): not predicted"


@dataclass
class Prediction:
    """Predicted seconds per event (``None``: cannot be predicted), where each came from
    (``sources[i]``: a :class:`~commdebug.estimate.curves.Where`, None when not predicted) and
    what was assumed."""

    cluster: Cluster
    seconds: list[float | None]
    notes: list[str] = field(default_factory=list)
    sources: list[Where | None] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(s for s in self.seconds if s is not None)


def effective_size(event: CollectiveEvent) -> int:
    """The bytes the prediction charges an event: its message size S (docs/collectives.md).
    The one place an event's size enters the model, so that an op whose ranks move different
    amounts (an uneven all_to_all) can be charged its busiest rank's bytes here.

    An all_to_all with splits is bound by the busiest side: charged as an even all_to_all of
    ``max(bytes sent, bytes received)`` of the rank whose splits it carries (one dump: that
    rank's own; a folder's timed call: its busiest member's, see
    :func:`commdebug.estimate.timed.timed_calls`). An even one charges its S, as before."""
    if event.send_splits is not None or event.recv_splits is not None:
        return max(sum(event.send_splits or ()), sum(event.recv_splits or ()))
    return event.size_bytes or 0  # a size not known never reaches here (predict_events skips it)


def _placement(ranks: Iterable[int], ranks_per_node: int) -> tuple[str, int]:
    """("intra_node" | "network", k): the link kind a group of global ranks crosses, and the
    fewest of its ranks on any one node (the whole group inside one node)."""
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[r // ranks_per_node] = per_node.get(r // ranks_per_node, 0) + 1
    if len(per_node) <= 1:
        return "intra_node", sum(per_node.values())
    return "network", min(per_node.values())


def _link_busbw(cluster: Cluster, link: str, k: int) -> float:
    """Effective busbw in GB/s of a group on ``link`` with k ranks per node: the intra-node
    figure; across nodes k NICs' worth, at most the intra-node figure when k > 1."""
    if link == "intra_node":
        return cluster.intra_node.busbw_gbps
    bw = cluster.network.busbw_gbps * k
    return min(bw, cluster.intra_node.busbw_gbps) if k > 1 else bw


# ops whose curves stand in for each other when one was not measured: same busbw factor and
# the same ring step count
_SIBLINGS = {"ring": ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"),
             "one": ("broadcast", "reduce", "send", "recv")}


class _Model:
    """The cluster's curves by (op, link), and the time of one call from them or the links."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.curves: dict[tuple[str, str], list[Curve]] = {}
        for c in cluster.curves:
            self.curves.setdefault((c.op, c.link), []).append(c)

    def _candidates(self, op: str, link: str) -> list[Curve]:
        own = self.curves.get((op, link))
        if own:
            return own
        spec = ops.spec_for_op(op)
        family = _SIBLINGS.get(spec.factor, ()) if spec else ()
        if op in family:
            return [c for sib in family for c in self.curves.get((sib, link), [])]
        return []

    def time(self, op: str, size: int, n: int, link: str, k: int, f: float) -> tuple[float, Where]:
        """Seconds of one call of ``op`` moving ``size`` bytes on n ranks (k per node) over
        ``link``; ``f``: the event's own busbw factor, which the alpha-beta line uses."""
        bw = _link_busbw(self.cluster, link, k)
        candidates = self._candidates(op, link)
        if candidates:
            curve = nearest(candidates, n, k)
            curve_bw = _link_busbw(self.cluster, link, curve.per_node)
            ratio = curve_bw / bw if link == "network" else 1.0
            fallback = curve_bw * 1e9
            return scaled(curve, op, size, n, k, bw_ratio=ratio, busbw_fallback=fallback)
        lat = getattr(self.cluster, link).latency_us
        t = lat * 1e-6 + size * f / (bw * 1e9)
        return t, Where("alpha-beta", f"alpha-beta on {link} of {self.cluster.name}: {lat:g} us + S x f / {bw:g} GB/s")


def predict_events(events: Iterable[CollectiveEvent], cluster: Cluster, *, rank: int = 0,
                   ranks_per_node: int | None = None) -> Prediction:
    """Predicted seconds of each event, in order, with where each came from.
    ``rank``: the recording rank (for send/recv)."""
    rpn = ranks_per_node or cluster.gpus_per_node
    pred = Prediction(cluster, [])
    model = _Model(cluster)
    cache: dict[tuple, tuple[str, int]] = {}
    notes: set[str] = set()
    for e in events:
        group = e.group
        if e.size_bytes is None:  # a trace recorded without shapes: nothing to predict from
            pred.seconds.append(None)
            pred.sources.append(None)
            notes.add(NOTE_NO_BYTES)
            continue
        if e.peer is not None:  # send/recv: this rank and its peer
            key: tuple = ("p2p", rank // rpn == e.peer // rpn)
            ranks: tuple[int, ...] = (rank, e.peer)
        elif group.size <= 0 and group.ranks is None:
            pred.seconds.append(None)
            pred.sources.append(None)
            notes.add(NOTE_NO_SIZE)
            continue
        else:
            ranks = group.ranks if group.ranks is not None else tuple(range(group.size))
            if group.ranks is None:
                notes.add(NOTE_NO_RANKS)
            key = ("group", group.name, ranks)
        n = len(set(ranks))
        if n <= 1:  # a group of one moves nothing
            pred.seconds.append(0.0)
            pred.sources.append(Where("trivial", "a group of one rank moves nothing"))
            continue
        placed = cache.get(key)
        if placed is None:
            placed = cache[key] = _placement(ranks, rpn)
        link, k = placed
        factor = e.busbw_factor
        if factor is None:  # the call's group size was not known; the ranks placed here give it
            spec = ops.spec_for_op(e.op)
            factor = spec.busbw_factor(n) if spec is not None else 1.0
        seconds, where = model.time(e.op, effective_size(e), n, link, k, factor)
        pred.seconds.append(seconds)
        pred.sources.append(where)
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
