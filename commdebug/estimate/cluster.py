"""A target cluster: GPUs per node, the intra-node link and the inter-node network, each as an
achievable bus bandwidth (GB/s, nccl-tests' busbw) and a latency (us). Loaded from a preset name
or a JSON file (schema in docs/estimate.md); every bad key or value is one error naming it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commdebug.errors import CommDebugError
from commdebug.estimate.curves import Curve

__all__ = ["Link", "Cluster", "ClusterError"]


class ClusterError(CommDebugError, ValueError):
    """A bad cluster description: unknown preset, unreadable file, unknown key, bad value."""


@dataclass(frozen=True)
class Link:
    """One kind of link: achievable bus bandwidth in GB/s (1e9 bytes/s) and latency in us."""

    busbw_gbps: float
    latency_us: float

    def to_dict(self) -> dict[str, float]:
        return {"busbw_gbps": self.busbw_gbps, "latency_us": self.latency_us}


@dataclass(frozen=True)
class Cluster:
    """``network.busbw_gbps`` is per GPU (one NIC per GPU, or the GPU's share of the node's
    NICs); a group with k of its ranks on each node reaches k times it, at most the intra-node
    figure (docs/estimate.md, the model)."""

    name: str
    gpus_per_node: int
    intra_node: Link
    network: Link
    description: str = ""
    sources: tuple[str, ...] = field(default=())
    # measured curves (commdebug calibrate on timed dumps or nccl-tests output): predictions
    # follow them where they cover an op and link; the two links above stay the fallback
    curves: tuple[Curve, ...] = field(default=())

    @property
    def model(self) -> str:
        """Which model predicts on this cluster, in words (the reports say it)."""
        if not self.curves:
            return "alpha-beta: one latency and one busbw per link kind (t = latency + S x f / busbw)"
        ops = sorted({c.op for c in self.curves})
        return (f"measured curves ({len(self.curves)}: {', '.join(ops)}): log-log interpolation between measured sizes,"
                " ring/tree step counts beyond them; alpha-beta per link for the rest")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out.update(gpus_per_node=self.gpus_per_node, intra_node=self.intra_node.to_dict(), network=self.network.to_dict())
        if self.sources:
            out["sources"] = list(self.sources)
        if self.curves:
            out["curves"] = [c.to_dict() for c in self.curves]
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "cluster") -> Cluster:
        """A cluster from the JSON schema; ``where`` (a file name) starts every error."""
        if not isinstance(data, Mapping):
            raise ClusterError(f"{where}: a cluster description is a JSON object, got {type(data).__name__}")
        _no_unknown(data, _KEYS, where, "")
        for key in ("gpus_per_node", "intra_node", "network"):
            if key not in data:
                raise ClusterError(f"{where}: missing key {key!r} (needed: gpus_per_node, intra_node, network)")
        gpus = data["gpus_per_node"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ClusterError(f"{where}: gpus_per_node must be a whole number >= 1, got {gpus!r}")
        name = data.get("name", Path(where).stem if where != "cluster" else "custom")
        if not isinstance(name, str) or not name.strip():
            raise ClusterError(f"{where}: name must be non-empty text, got {name!r}")
        description = data.get("description", "")
        if not isinstance(description, str):
            raise ClusterError(f"{where}: description must be text, got {description!r}")
        sources = data.get("sources", [])
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise ClusterError(f"{where}: sources must be a list of text, got {sources!r}")
        curves = data.get("curves", [])
        if not isinstance(curves, list):
            raise ClusterError(f"{where}: curves must be a list of measured curves, got {curves!r}")
        parsed = []
        for i, c in enumerate(curves):
            try:
                parsed.append(Curve.from_dict(c, f"{where}: curves[{i}]"))
            except ClusterError:
                raise
            except CommDebugError as e:
                raise ClusterError(str(e)) from None
        return cls(name, gpus, _link(data["intra_node"], "intra_node", where), _link(data["network"], "network", where),
                   description, tuple(sources), tuple(parsed))


_KEYS = ("name", "description", "gpus_per_node", "intra_node", "network", "sources", "curves")
_LINK_KEYS = ("busbw_gbps", "latency_us")


def _no_unknown(data: Mapping, known: tuple[str, ...], where: str, prefix: str) -> None:
    for key in data:
        if key not in known:
            raise ClusterError(f"{where}: unknown key {prefix + str(key)!r} (known: {', '.join(prefix + k for k in known)})")


def _link(data: Any, key: str, where: str) -> Link:
    if not isinstance(data, Mapping):
        raise ClusterError(f"{where}: {key} must be an object with busbw_gbps and latency_us, got {data!r}")
    _no_unknown(data, _LINK_KEYS, where, key + ".")
    values = []
    for k in _LINK_KEYS:
        if k not in data:
            raise ClusterError(f"{where}: missing key {key + '.' + k!r}")
        v = data[k]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (v <= 0 if k == "busbw_gbps" else v < 0):
            bound = "> 0" if k == "busbw_gbps" else ">= 0"
            raise ClusterError(f"{where}: {key}.{k} must be a number {bound}, got {v!r}")
        values.append(float(v))
    return Link(*values)
