"""Fit a cluster's latency and bandwidth from nccl-tests output (``all_reduce_perf`` & co.).

Each data row of nccl-tests' text output is ``size count type redop root`` then time (us),
algbw, busbw, #wrong for out-of-place and again for in-place. With S = size and the op's busbw
factor f at the run's rank count, both times are fitted to t = a + S*f/B by least squares on
relative error (so small sizes fix a and large sizes fix B). Runs on one node give the intra-node
link; runs spanning nodes give the network, whose per-GPU busbw is B / k (k ranks per node).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from commdebug.errors import CommDebugError
from commdebug.estimate.cluster import Cluster, Link
from commdebug.ops import BUSBW_FACTORS, aliases, spec_for_op

__all__ = ["NcclTestsRun", "parse_nccl_tests", "fit", "calibrate"]

_STARTING = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+.*?\bon\s+(\S+)\s+device")
_NGPUS = re.compile(r"nGpus\s+(\d+)")


@dataclass
class NcclTestsRun:
    """One nccl-tests output: its op, ranks, hosts and (S, time in seconds) points."""

    source: str
    op: str
    factor: str
    ranks: int
    hosts: int
    points: list[tuple[int, float]]


def _op_of(text: str, path: Path) -> tuple[str, str]:
    """(our op, busbw factor name) of the test a file names, in its output or its file name."""
    m = _STARTING.search(text)
    names = [m.group(1)] if m else []
    names.append(path.name)
    tests = aliases("nccl_tests")
    for name in names:
        for key in sorted(tests, key=len, reverse=True):  # reduce_scatter before reduce
            if key in name:
                spec = spec_for_op(tests[key])
                if spec is not None:
                    return spec.op, spec.factor
    raise CommDebugError(f"{path}: cannot tell which collective this is (no 'Collective test starting' line;"
                         f" name the file after the test, e.g. all_reduce_perf.txt)")


def parse_nccl_tests(path: str | Path) -> NcclTestsRun:
    """Read one nccl-tests text output; a clear error when it is not one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise CommDebugError(f"{p}: no such file") from None
    except OSError as e:
        raise CommDebugError(f"{p}: cannot read: {e.strerror or e}") from None
    op, factor = _op_of(text, p)
    hosts: dict[int, str] = {}
    points: list[tuple[int, float]] = []
    for line in text.splitlines():
        m = _RANK.match(line.strip())
        if m:
            hosts[int(m.group(1))] = m.group(2)
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cols = line.split()
        if len(cols) < 9 or not cols[0].isdigit():
            continue  # NCCL INFO lines and the like
        size = int(cols[0])
        # out-of-place time at column 5, in-place 4 columns later (time algbw busbw #wrong)
        for i in (5, 9):
            if i < len(cols):
                try:
                    t = float(cols[i])
                except ValueError:
                    continue
                if t > 0 and size > 0:
                    points.append((size, t * 1e-6))
    if not points:
        raise CommDebugError(f"{p}: no nccl-tests result rows (size count type redop root time algbw busbw #wrong ...)")
    ranks = len(hosts)
    if not ranks:
        m = _NGPUS.search(text)
        ranks = int(m.group(1)) if m else 0
    if ranks < 2:
        raise CommDebugError(f"{p}: cannot tell how many ranks ran (no '#  Rank N ... on HOST device' lines)")
    return NcclTestsRun(str(p), op, factor, ranks, len(set(hosts.values())) or 1, points)


def fit(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """(a seconds, B bytes/s) minimising sum(((a + x/B) - t) / t)^2 over (x = S*f, t) points."""
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


def calibrate(paths: Iterable[str | Path], *, gpus_per_node: int | None = None, base: Cluster | None = None,
              name: str = "calibrated") -> tuple[Cluster, list[str]]:
    """A cluster fitted from nccl-tests outputs, and notes (which link each file fitted, what
    came from ``base`` because no file measured it)."""
    runs = [parse_nccl_tests(p) for p in paths]
    if not runs:
        raise CommDebugError("no nccl-tests files given")
    per_node = gpus_per_node
    if per_node is None:
        per_node = max(-(-r.ranks // r.hosts) for r in runs)  # ranks per host, from the Rank lines
    intra: list[tuple[float, float]] = []
    net: list[tuple[float, float]] = []
    notes: list[str] = []
    for r in runs:
        nodes = r.hosts if gpus_per_node is None else -(-r.ranks // per_node)
        f = BUSBW_FACTORS[r.factor](r.ranks)
        if nodes <= 1:
            intra.extend((s * f, t) for s, t in r.points)
            notes.append(f"{r.source}: {r.op} on {r.ranks} ranks in one node -> intra_node")
        else:
            k = -(-r.ranks // nodes)  # ranks per node in this run: per-GPU share is B / k
            net.extend((s * f / k, t) for s, t in r.points)
            notes.append(f"{r.source}: {r.op} on {r.ranks} ranks over {nodes} nodes -> network (per GPU: busbw / {k})")
    links: dict[str, Link] = {}
    for key, pts in (("intra_node", intra), ("network", net)):
        if pts:
            a, bw = fit(pts)
            links[key] = Link(round(bw / 1e9, 3), round(a * 1e6, 3))
        elif base is not None:
            links[key] = getattr(base, key)
            notes.append(f"{key}: no file measured it; taken from {base.name}")
        else:
            raise CommDebugError(f"no nccl-tests file measured the {key.replace('_', '-')} link; give one, or --base PRESET")
    cluster = Cluster(name, per_node, links["intra_node"], links["network"], "fitted by commdebug calibrate",
                      tuple(f"fitted from {r.source}" for r in runs))
    return cluster, notes
