"""Built-in clusters, and :func:`load_cluster`, which names one of them or reads a cluster file.

The clusters come with the published figures each number was taken from (docs/estimate.md
gives the links). Latencies are not published nccl-tests rows: they come from NCCL's own tuning
constants (base 6.6 us plus per-hop latencies, Ring/LL), as copied in torch's
``torch/_inductor/comm_analysis.py`` (``baseLat``, ``hwLat``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from commdebug.estimate.cluster import Cluster, ClusterError, Link

__all__ = ["PRESETS", "PUBLISHED", "Published", "load_cluster"]

# Ring/LL latency from NCCL's tuning constants: 6.6 us base + 0.6 us per NVLink hop (7 hops on 8
# GPUs) = 10.8 us; across 2 nodes of 8: 6.6 + 14 intra hops x 1.0 us (the network overhead
# floor) + 1 network hop x 2.7 us = 23.3 us.
_INTRA_LAT_US = 10.8
_NET_LAT_US = 23.3

PRESETS: dict[str, Cluster] = {
    "h100-ib400": Cluster(
        "h100-ib400", 8, Link(370.0, _INTRA_LAT_US), Link(48.0, _NET_LAT_US),
        "8 H100 SXM per node on NVLink 4 / NVSwitch; one 400 Gb/s (NDR) InfiniBand NIC per GPU",
        ("intra busbw 370 GB/s: NVIDIA/nccl-tests#212 (NCCL's effective NVLink bandwidth on H100 with ring, non-all_reduce ops)",
         "network 48 GB/s per GPU: NVIDIA/nccl-tests#267 (CX-7 at NDR 400 Gb/s reaches 48-49 GB/s per NIC)",
         "latencies: NCCL tuning constants (baseLat, hwLat) as in torch/_inductor/comm_analysis.py"),
    ),
    "a100-ib200": Cluster(
        "a100-ib200", 8, Link(230.0, _INTRA_LAT_US), Link(24.0, _NET_LAT_US),
        "8 A100 SXM4 per node on NVLink 3 / NVSwitch; one 200 Gb/s (HDR) InfiniBand NIC per GPU",
        ("intra busbw 230 GB/s: NVIDIA/nccl-tests#175 (8 A100 in one node, all_reduce_perf 232.54 GB/s)",
         "network 24 GB/s per GPU: NVIDIA/nccl#412 (peak for one 200G HDR NIC 24 GB/s) and NVIDIA/nccl#812 (DGX-A100, 8x200 Gb/s: 192 GB/s all_reduce busbw = 8 x 24)",
         "latencies: NCCL tuning constants (baseLat, hwLat) as in torch/_inductor/comm_analysis.py"),
    ),
}


class Published(NamedTuple):
    """One published nccl-tests figure: op, ranks, nodes, message size S, busbw GB/s, where."""

    op: str
    ranks: int
    nodes: int
    size_bytes: int
    busbw_gbps: float
    source: str


PUBLISHED: dict[str, list[Published]] = {
    "h100-ib400": [
        Published("all_reduce", 8, 1, 8 << 30, 479.41, "NVIDIA/nccl-tests#347 (NVLS, 8 GiB)"),
        Published("all_gather", 8, 1, 1 << 30, 370.0, "NVIDIA/nccl-tests#212 (effective NVLink busbw, ring; no size given)"),
        Published("all_reduce", 16, 2, 8 << 30, 470.0, "NVIDIA/nccl-tests#309 (user report, 2 HGX nodes, 8 NICs each)"),
        Published("all_reduce", 32, 4, 8 << 30, 365.84, "NVIDIA/nccl-tests#309 (same user, 4 nodes)"),
    ],
    "a100-ib200": [
        Published("all_reduce", 8, 1, 4 << 30, 232.54, "NVIDIA/nccl-tests#175 (8 A100, one node)"),
        Published("all_reduce", 16, 2, 8 << 30, 192.0, "NVIDIA/nccl#812 (NVIDIA's DGX-A100 figure, 8x200 Gb/s IB)"),
    ],
}


def load_cluster(spec: str | os.PathLike | Cluster | Mapping[str, Any]) -> Cluster:
    """A preset name (``"h100-ib400"``), a JSON file, a dict of the schema, or a Cluster."""
    if isinstance(spec, Cluster):
        return spec
    if isinstance(spec, Mapping):
        return Cluster.from_dict(spec)
    text = os.fspath(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if not path.exists():
        raise ClusterError(f"{text}: neither a preset ({', '.join(PRESETS)}) nor an existing cluster file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise ClusterError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return Cluster.from_dict(data, str(path))
