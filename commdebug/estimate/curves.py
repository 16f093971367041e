"""Measured time curves: one per op, link kind and group size, and how a prediction follows them.

A :class:`Curve` holds the measured time of one op at several message sizes, on a group of
``ranks`` ranks with ``per_node`` of them on each node (the fewest on any node; the whole group
when it stays inside one node). :meth:`Curve.at` gives the time at any size S:

- at a measured size: that point, exactly;
- between two measured sizes: interpolated on a straight line in log(S)-log(t);
- below the smallest measured size: that point's time less the bytes' share at the fitted
  bandwidth (latency-bound: nearly flat); above the largest: that point's time plus the extra
  bytes at the fitted bandwidth.

:func:`scaled` carries a curve to another group size or op with the algorithms' step counts:
the curve's time splits into a latency part L (the fitted latency, at most the smallest point)
and a bandwidth part W(S) = t(S) - L. The latency is per ring step x the steps (all_reduce
2(n-1), all_gather / reduce_scatter / all_to_all / broadcast (n-1), send/recv 1; across nodes
all_reduce takes NCCL's tree when it has fewer steps: 2(log2 nodes + k - 1)); the bandwidth
part scales with the op's busbw factor at n (the bytes each rank moves) and, across nodes, with
the NICs the group can use (k per node). So a curve measured on 8 ranks predicts 64.

Every value comes with where it came from (:class:`Where`), as text the reports show.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from commdebug.errors import CommDebugError
from commdebug.ops import spec_for_op
from commdebug.units import format_bytes

__all__ = ["Curve", "Where", "LINKS", "fit_alpha_beta", "ring_steps", "steps", "factor", "scaled", "regime"]

LINKS = ("intra_node", "network")

# Regimes, by the fitted line's share of latency in a point's time: latency-bound when the
# bytes take under 20% of it, bandwidth-bound when they take over 80%, the ramp between.
_LATENCY_BOUND, _BANDWIDTH_BOUND = 0.2, 0.8


class Where(NamedTuple):
    """How a predicted time was obtained: ``kind`` one of ``measured``, ``interpolated``,
    ``extrapolated``, ``alpha-beta``; ``text`` says from what, e.g. ``interpolated between 1.00
    MiB and 2.00 MiB of all_reduce on 2 ranks (intra_node)``."""

    kind: str
    text: str


def fit_alpha_beta(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """(a seconds, B bytes/s) minimising sum(((a + x/B) - t) / t)^2 over (x = S*f, t) points:
    relative error, so small sizes fix a and large sizes fix B."""
    sw = swx = swxx = swt = swxt = 0.0
    n = 0
    for x, t in points:
        w = 1.0 / (t * t)
        sw += w
        swx += w * x
        swxx += w * x * x
        swt += w * t
        swxt += w * x * t
        n += 1
    det = sw * swxx - swx * swx
    if n < 2 or det <= 0:
        raise CommDebugError("need results at two or more message sizes to fit latency and bandwidth")
    slope = (sw * swxt - swx * swt) / det
    a = (swt - slope * swx) / sw
    if not slope > 0 or not math.isfinite(slope):
        raise CommDebugError("time does not grow with message size in these results: cannot fit a bandwidth")
    return max(a, 0.0), 1.0 / slope


def factor(op: str, n: int) -> float:
    """The op's busbw factor at group size n (docs/collectives.md); 1 for an op the registry
    does not know."""
    spec = spec_for_op(op)
    return spec.busbw_factor(n) if spec else 1.0


def ring_steps(op: str, n: int) -> int:
    """Latency steps of the ring algorithm on n ranks: 2(n-1) for all_reduce (and a barrier,
    an all_reduce of nothing), 1 for send/recv, (n-1) for the others."""
    if n <= 1:
        return 0
    if op in ("all_reduce", "barrier"):
        return 2 * (n - 1)
    if op in ("send", "recv", "batch_p2p"):
        return 1
    return n - 1


def steps(op: str, n: int, per_node: int, network: bool) -> tuple[int, str]:
    """(latency steps, which algorithm and formula) as NCCL would run the op: the ring, except
    an all_reduce across nodes whose tree (2(log2 nodes + k - 1) steps: down and up a tree of
    nodes and a chain of the k ranks in each) has fewer steps."""
    ring = ring_steps(op, n)
    formula = {2: "ring 2(n-1)", 1: "ring n-1"}
    text = "p2p 1" if op in ("send", "recv", "batch_p2p") else formula[2 if op in ("all_reduce", "barrier") else 1]
    if op == "all_reduce" and network and n > 2:
        nodes = -(-n // max(per_node, 1))
        tree = 2 * (math.ceil(math.log2(nodes)) + max(per_node, 1) - 1) if nodes > 1 else ring
        if tree < ring:
            return tree, f"tree 2(log2 nodes + k - 1) = {tree}"
    return ring, f"{text} = {ring}"


def regime(latency_s: float, bytes_s: float) -> str:
    """latency-bound, ramp or bandwidth-bound: the bytes' share of the fitted time."""
    total = latency_s + bytes_s
    share = bytes_s / total if total > 0 else 0.0
    if share < _LATENCY_BOUND:
        return "latency-bound"
    if share > _BANDWIDTH_BOUND:
        return "bandwidth-bound"
    return "ramp"


@dataclass(frozen=True)
class Curve:
    """Measured time of ``op`` on a group of ``ranks`` ranks over one link kind, at ascending
    message sizes (``sizes``, bytes S as the events carry them; ``seconds``: the time per call at
    each, ``calls``: how many calls each point summarises). ``per_node``: the group's fewest ranks
    on any node (the whole group inside one node).

    >>> c = Curve("all_reduce", "intra_node", 2, 2, (1024, 4096), (1e-5, 2e-5), (5, 5))
    >>> c.at(1024)[0], c.at(2048)[1].kind
    (1e-05, 'interpolated')
    """

    op: str
    link: str
    ranks: int
    per_node: int
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    calls: tuple[int, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds) or len(self.calls) != len(self.sizes):
            raise CommDebugError(f"curve {self.op} on {self.ranks} ranks: sizes, seconds and calls differ in length or are empty")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise CommDebugError(f"curve {self.op} on {self.ranks} ranks: sizes must be strictly ascending")

    @property
    def label(self) -> str:
        return f"{self.op} on {self.ranks} ranks ({self.link})"

    @cached_property
    def f(self) -> float:
        return factor(self.op, self.ranks)

    @cached_property
    def fit(self) -> tuple[float, float | None]:
        """(latency seconds, busbw bytes/s or None) of the alpha-beta line through the points;
        with fewer than two sizes or no growth, the smallest time and no bandwidth."""
        pts = [(s * self.f, t) for s, t in zip(self.sizes, self.seconds, strict=True) if t > 0]
        try:
            a, bw = fit_alpha_beta(pts)
        except CommDebugError:
            return min(self.seconds), None
        return min(a, min(self.seconds)), bw

    @property
    def latency_s(self) -> float:
        """The latency part L: the fitted latency, at most the smallest measured time."""
        return self.fit[0]

    def fitted(self, size: int) -> float:
        a, bw = self.fit
        return a + (size * self.f / bw if bw else 0.0)

    def residuals(self) -> list[float]:
        """(measured - fitted) / fitted at each point: how far the points leave one line."""
        return [(t - self.fitted(s)) / self.fitted(s) if self.fitted(s) > 0 else 0.0
                for s, t in zip(self.sizes, self.seconds, strict=True)]

    def regimes(self) -> list[str]:
        a, bw = self.fit
        return [regime(a, s * self.f / bw if bw else 0.0) for s in self.sizes]

    def at(self, size: int, busbw_fallback: float | None = None) -> tuple[float, Where]:
        """Time at message size ``size`` on this curve's own group, and where it comes from.
        ``busbw_fallback`` (bytes/s): the bandwidth beyond the points when the curve has none."""
        sizes, secs = self.sizes, self.seconds
        i = bisect.bisect_left(sizes, size)
        if i < len(sizes) and sizes[i] == size:
            return secs[i], Where("measured", f"measured point {format_bytes(size)} of {self.label}")
        bw = self.fit[1] or busbw_fallback
        if i == 0:
            t = secs[0] - ((sizes[0] - size) * self.f / bw if bw else 0.0)
            t = max(t, min(self.latency_s, secs[0]))
            return t, Where("extrapolated", f"extrapolated below the smallest measured size {format_bytes(sizes[0])} of {self.label} (latency-bound)")
        if i == len(sizes):
            t = secs[-1] + ((size - sizes[-1]) * self.f / bw if bw else 0.0)
            how = "at the fitted bandwidth" if self.fit[1] else ("at the link's bandwidth" if bw else "flat: no bandwidth measured")
            return t, Where("extrapolated", f"extrapolated above the largest measured size {format_bytes(sizes[-1])} of {self.label}, {how}")
        lo, hi = sizes[i - 1], sizes[i]
        tlo, thi = secs[i - 1], secs[i]
        if lo <= 0 or tlo <= 0 or thi <= 0:  # a zero size has no logarithm: a straight line
            t = tlo + (thi - tlo) * (size - lo) / (hi - lo)
        else:
            w = (math.log(size) - math.log(lo)) / (math.log(hi) - math.log(lo))
            t = math.exp(math.log(tlo) + w * (math.log(thi) - math.log(tlo)))
        return t, Where("interpolated", f"interpolated between {format_bytes(lo)} and {format_bytes(hi)} of {self.label}")

    def to_dict(self) -> dict[str, Any]:
        """The cluster file's form: the points, with the fit, each point's residual and regime."""
        a, bw = self.fit
        res, regs = self.residuals(), self.regimes()
        return {
            "op": self.op, "link": self.link, "ranks": self.ranks, "per_node": self.per_node,
            "fit": {"latency_us": round(a * 1e6, 4), "busbw_gbps": None if bw is None else round(bw / 1e9, 4)},
            "points": [{"size_bytes": s, "seconds": t, "calls": c, "residual": round(r, 4), "regime": g}
                       for s, t, c, r, g in zip(self.sizes, self.seconds, self.calls, res, regs, strict=True)],
            **({"source": self.source} if self.source else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Curve:
        """A curve from :meth:`to_dict`'s form; the fit, residuals and regimes are recomputed
        from the points (they are there for people to read)."""
        if not isinstance(data, dict):
            raise CommDebugError(f"{where}: a curve is an object, got {data!r}")
        known = ("op", "link", "ranks", "per_node", "fit", "points", "source")
        for k in data:
            if k not in known:
                raise CommDebugError(f"{where}: unknown key {k!r} (known: {', '.join(known)})")
        for k in ("op", "link", "ranks", "points"):
            if k not in data:
                raise CommDebugError(f"{where}: missing key {k!r}")
        op, link = data["op"], data["link"]
        if not isinstance(op, str) or spec_for_op(op) is None:
            raise CommDebugError(f"{where}: op must be a collective's name (all_reduce, all_gather, ...), got {op!r}")
        if link not in LINKS:
            raise CommDebugError(f"{where}: link must be one of {', '.join(LINKS)}, got {link!r}")
        ranks = _whole(data["ranks"], f"{where}: ranks")
        per_node = _whole(data.get("per_node", ranks), f"{where}: per_node")
        points = data["points"]
        if not isinstance(points, list) or not points:
            raise CommDebugError(f"{where}: points must be a non-empty list")
        sizes, secs, calls = [], [], []
        for i, p in enumerate(points):
            if not isinstance(p, dict) or "size_bytes" not in p or "seconds" not in p:
                raise CommDebugError(f"{where}: points[{i}] must have size_bytes and seconds, got {p!r}")
            s, t = p["size_bytes"], p["seconds"]
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise CommDebugError(f"{where}: points[{i}].size_bytes must be a whole number >= 0, got {s!r}")
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                raise CommDebugError(f"{where}: points[{i}].seconds must be a number > 0, got {t!r}")
            sizes.append(s)
            secs.append(float(t))
            calls.append(int(p.get("calls", 1)))
        if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise CommDebugError(f"{where}: points must be in strictly ascending size_bytes")
        source = data.get("source", "")
        return cls(op, link, ranks, per_node, tuple(sizes), tuple(secs), tuple(calls), str(source))


def _whole(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CommDebugError(f"{what} must be a whole number >= 1, got {v!r}")
    return v


def scaled(curve: Curve, op: str, size: int, n: int, per_node: int, *, bw_ratio: float = 1.0,
           busbw_fallback: float | None = None) -> tuple[float, Where]:
    """The time of ``op`` at message size ``size`` on a group of ``n`` ranks (``per_node`` per
    node) from ``curve``, measured on another group size or op: the curve's latency part per
    step x the steps at n, plus its bandwidth part at the same size x the busbw factors' ratio.
    ``bw_ratio``: the curve's link bandwidth over the target's (fewer NICs per node: > 1)."""
    t0, where0 = curve.at(size, busbw_fallback)
    if curve.op == op and curve.ranks == n and curve.per_node == per_node and bw_ratio == 1.0:
        return t0, where0
    network = curve.link == "network"
    s0, how0 = steps(curve.op, curve.ranks, curve.per_node, network)
    s1, how1 = steps(op, n, per_node, network)
    lat = min(curve.latency_s, t0)
    per_step = lat / s0 if s0 else 0.0
    f0, f1 = curve.f, factor(op, n)
    w = (t0 - lat) * (f1 / f0 if f0 else 1.0) * bw_ratio
    t = per_step * s1 + w
    target = f"{op} on {n} ranks" if op != curve.op else f"{n} ranks"
    text = (f"extrapolated from {curve.label} to {target}: latency {lat * 1e6:.1f} us / {how0} steps x {how1},"
            f" bytes x busbw factor {f1:.3f}/{f0:.3f}" + (f" x link {bw_ratio:.2f}" if bw_ratio != 1.0 else "")
            + f" (base: {where0.text})")
    return t, Where("extrapolated", text)


def nearest(curves: Sequence[Curve], n: int, per_node: int) -> Curve:
    """The curve measured on the group size closest to n (in ratio), then per_node."""
    return min(curves, key=lambda c: (abs(math.log(c.ranks / n)) if n > 0 else c.ranks, abs(c.per_node - per_node), -c.ranks))
