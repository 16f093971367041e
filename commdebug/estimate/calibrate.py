"""Fit a cluster from nccl-tests output (``all_reduce_perf`` & co.) and from timed dumps.

Timed dumps (ours, or Flight Recorder's with durations; a folder of ranks or one file) give each
call's shortest latency over the ranks (commdebug/estimate/timed.py); repeated calls of one op
at one size on one group become one point (their median), and the points of one op, link kind
and group size a measured :class:`~commdebug.estimate.curves.Curve`.

Each data row of nccl-tests' text output is ``size count type redop root`` then time (us),
algbw, busbw, #wrong for out-of-place and again for in-place. With S = size and the op's busbw
factor f at the run's rank count, both times are fitted to t = a + S*f/B by least squares on
relative error (so small sizes fix a and large sizes fix B). Runs on one node give the intra-node
link; runs spanning nodes give the network, whose per-GPU busbw is B / k (k ranks per node).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from commdebug import ops
from commdebug.errors import CommDebugError, empty_file, missing_path
from commdebug.estimate.alpha_beta import effective_size
from commdebug.estimate.cluster import Cluster, Link
from commdebug.estimate.curves import Curve, fit_alpha_beta
from commdebug.estimate.timed import TimedJob
from commdebug.ops import aliases, spec_for_op

__all__ = ["NcclTestsRun", "parse_nccl_tests", "fit", "calibrate", "is_nccl_tests_file", "STATISTICS", "monotone"]

fit = fit_alpha_beta  # this module's name for it before the fit moved to curves.py

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
        raise missing_path(p) from None
    except OSError as e:
        raise CommDebugError(f"{p}: cannot read: {e.strerror or e}") from None
    if not text:
        raise empty_file(p)
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


def is_nccl_tests_file(path: Path) -> bool:
    """Whether a calibration input is nccl-tests text (else a timed dump: a folder of ranks, a
    JSON dump or stream, a Flight Recorder pickle or JSON, a torch.profiler trace)."""
    if path.is_dir():
        return False
    try:
        with path.open("rb") as f:
            head = f.read(64).lstrip()
    except FileNotFoundError:
        raise missing_path(path) from None
    except OSError as e:
        raise CommDebugError(f"{path}: cannot read: {e.strerror or e}") from None
    return not head.startswith((b"{", b"[", b"\x80", b"\x1f\x8b"))  # \x1f\x8b: a gzipped trace


# One point from repeated calls at the same size. The median (default): a call slowed by another
# process does not move the curve, and the curve predicts the typical call. The minimum: the
# undisturbed time, for comparing with programs measured the same way, with as many repeats (a
# minimum over more samples is lower). The 10th percentile (p10): near the undisturbed time,
# without the minimum's lone outliers. Each way the points are then made non-decreasing in size
# (:func:`monotone`).
def p10(values: list[float]) -> float:
    """The 10th percentile (nearest rank, the lower one: the 3rd fastest of 21, the fastest of
    up to 10). Near the minimum, without its lone outliers: a call timed as its shortest latency
    over the ranks is sometimes far below the rest, when its last member arrived after the
    others had already sent it their data (on gloo, into its sockets), and a minimum picks
    exactly that call.

    >>> p10([0.15, 0.70, 0.75, 0.77, 0.78, 0.87, 0.90, 0.96, 1.0, 1.1, 1.2, 3.0])
    0.7
    """
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 10]


STATISTICS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min, "p10": p10}


def monotone(seconds: list[float], weights: list[int]) -> list[float]:
    """The closest non-decreasing curve to ``seconds`` (least squares weighted by each point's
    calls: pool-adjacent-violators): a size that came out faster than a smaller one is noise the
    repeats did not remove, so the two are pooled into their weighted mean. Pooling, not lowering
    every point to the smallest later one: a running minimum over many sizes picks the luckiest
    of many noisy samples and predicts below what any one call measures.

    >>> monotone([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1])
    [1.0, 2.5, 2.5, 4.0]
    """
    blocks: list[list[float]] = []  # [weighted sum, weight, points]
    for t, w in zip(seconds, weights, strict=True):
        blocks.append([t * max(w, 1), float(max(w, 1)), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
    out: list[float] = []
    for total, weight, points in blocks:
        out += [total / weight] * int(points)
    return out


class _Points:
    """Measured times gathered per curve: (op, link, ranks, per_node) -> size -> seconds."""

    def __init__(self, statistic: str = "median") -> None:
        if statistic not in STATISTICS:
            raise CommDebugError(f"unknown statistic {statistic!r} (choose from: {', '.join(STATISTICS)})")
        self.statistic = STATISTICS[statistic]
        self.by_curve: dict[tuple[str, str, int, int], dict[int, list[float]]] = {}
        self.sources: dict[tuple[str, str, int, int], list[str]] = {}

    def add(self, key: tuple[str, str, int, int], size: int, seconds: float, source: str) -> None:
        self.by_curve.setdefault(key, {}).setdefault(size, []).append(seconds)
        srcs = self.sources.setdefault(key, [])
        if source not in srcs:
            srcs.append(source)

    def curves(self) -> list[Curve]:
        out = []
        for (op, link, n, k), sizes in sorted(self.by_curve.items()):
            ordered = sorted(sizes)
            counts = [len(sizes[s]) for s in ordered]
            secs = monotone([float(self.statistic(sizes[s])) for s in ordered], counts)
            out.append(Curve(op, link, n, k, tuple(ordered), tuple(secs), tuple(counts),
                             ", ".join(self.sources[(op, link, n, k)])))
        return out


def _from_nccl_tests(runs: list[NcclTestsRun], gpus_per_node: int | None, points: _Points, notes: list[str]) -> None:
    for r in runs:
        nodes = r.hosts if gpus_per_node is None else -(-r.ranks // gpus_per_node)
        link = "intra_node" if nodes <= 1 else "network"
        k = r.ranks if nodes <= 1 else -(-r.ranks // nodes)
        for size, t in r.points:
            points.add((r.op, link, r.ranks, k), size, t, r.source)
        if nodes <= 1:
            notes.append(f"{r.source}: {r.op} on {r.ranks} ranks in one node -> intra_node")
        else:
            notes.append(f"{r.source}: {r.op} on {r.ranks} ranks over {nodes} nodes -> network (per GPU: busbw / {k})")


def _from_dumps(job: TimedJob, gpus_per_node: int | None, points: _Points, notes: list[str]) -> int:
    """Add a timed job's calls (each at its shortest latency over the ranks); the ranks per node
    its hosts show (0: unknown)."""
    path = job.source or "timed dumps"
    if not job.calls:
        raise CommDebugError(f"{path}: no timed collectives (record with `commdebug run --timing` or CommDebugMode(timing='sync'),"
                             " or give Flight Recorder dumps with durations)")
    named = {r: h for r, h in job.hosts.items() if h}
    if gpus_per_node is not None:
        node_of = {r: r // gpus_per_node for r in job.hosts}
        per_node = gpus_per_node
    elif len(named) == len(job.hosts):
        index = {h: i for i, h in enumerate(dict.fromkeys(named[r] for r in sorted(named)))}
        node_of = {r: index[named[r]] for r in named}
        per_node = max(list(node_of.values()).count(i) for i in index.values())
    else:
        node_of = {}
        per_node = 0
        notes.append(f"{path}: the dumps do not name their hosts: all ranks taken as one node (--gpus-per-node to say otherwise)")
    skipped = 0
    for call in job.calls:
        e = call.event
        ranks = (call.rank, e.peer) if e.peer is not None else e.group.ranks
        if ranks is None:
            ranks = tuple(range(e.group.size))
        if len(set(ranks)) <= 1 or ops.spec_for_op(e.op) is None:
            skipped += 1
            continue
        per: dict[int, int] = {}
        for r in ranks:
            node = node_of.get(r, r // gpus_per_node if gpus_per_node else 0)
            per[node] = per.get(node, 0) + 1
        link = "intra_node" if len(per) <= 1 else "network"
        k = len(ranks) if len(per) <= 1 else min(per.values())
        points.add((e.op, link, len(set(ranks)), k), effective_size(e), call.seconds, str(path))
    measured = "each call's shortest latency over the ranks" if job.ranks > 1 else "one rank's own latencies (give the folder of ranks for the time once the last member arrived)"
    notes.append(f"{path}: {len(job.calls) - skipped} timed calls on {job.ranks} rank{'s' if job.ranks != 1 else ''} ({measured})"
                 + (f"; {job.untimed} untimed calls left out" if job.untimed else ""))
    return per_node


def calibrate(inputs: Iterable[str | Path | TimedJob], *, gpus_per_node: int | None = None, base: Cluster | None = None,
              name: str = "calibrated", statistic: str = "median") -> tuple[Cluster, list[str]]:
    """A cluster fitted from nccl-tests outputs (paths) and timed jobs (a
    :class:`~commdebug.estimate.timed.TimedJob` from :func:`~commdebug.estimate.timed.timed_calls`
    over a folder of ranks or one dump, ours or Flight Recorder's with durations), several
    combined: a measured curve per op, link kind and group size (docs/estimate.md), and each
    link's latency and busbw fitted over its curves' points (the fallback for ops no curve
    covers). ``statistic``: how repeated calls at one size become one point, ``median``,
    ``min`` or ``p10`` (the 10th percentile). Also notes: which input fitted what, and what came from ``base`` because nothing
    measured it.

    >>> job = timed_calls(iter_ranks("traces/"), source="traces")                # doctest: +SKIP
    >>> cluster, notes = calibrate([job, "all_reduce_perf.txt"], base=PRESETS["h100-ib400"])  # doctest: +SKIP
    """
    items = list(inputs)
    if not items:
        raise CommDebugError("nothing to calibrate from: give nccl-tests outputs or timed dumps")
    points = _Points(statistic)
    notes: list[str] = []
    runs = [parse_nccl_tests(p) for p in items if not isinstance(p, TimedJob)]
    dumps = [p for p in items if isinstance(p, TimedJob)]
    _from_nccl_tests(runs, gpus_per_node, points, notes)
    per_node = gpus_per_node or 0
    if gpus_per_node is None and runs:
        per_node = max(-(-r.ranks // r.hosts) for r in runs)  # ranks per host, from the Rank lines
    for d in dumps:
        per_node = max(per_node, _from_dumps(d, gpus_per_node, points, notes))
    curves = points.curves()
    if per_node <= 0:
        per_node = max((c.ranks for c in curves), default=1)
    links: dict[str, Link] = {}
    for key in ("intra_node", "network"):
        # a network curve's per-GPU share: busbw / k, as its k ranks per node use k NICs
        pts = [(s * c.f / (c.per_node if key == "network" else 1), t)
               for c in curves if c.link == key for s, t in zip(c.sizes, c.seconds, strict=True) if s > 0]
        if pts:
            try:
                a, bw = fit_alpha_beta(pts)
            except CommDebugError as e:
                raise CommDebugError(f"{key.replace('_', '-')} link: {e}") from None
            links[key] = Link(round(bw / 1e9, 6), round(a * 1e6, 3))
        elif base is not None:
            links[key] = getattr(base, key)
            notes.append(f"{key}: nothing measured it; taken from {base.name}")
        else:
            raise CommDebugError(f"no input measured the {key.replace('_', '-')} link; give one, or --base PRESET")
    cluster = Cluster(name, per_node, links["intra_node"], links["network"], "fitted by commdebug calibrate",
                      tuple(f"fitted from {p.source if isinstance(p, TimedJob) else p}" for p in items), tuple(curves))
    return cluster, notes
