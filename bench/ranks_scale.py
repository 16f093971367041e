"""Offline tools at job scale: `check`, `report`, `view` and `trace` over a folder of per-rank dumps.

Targets (issue 32, the 2-core machine): `commdebug check` and `report` >= 600k events/s on 1,024
ranks x 10,000 events, workers included, peak <= 500 MiB per process; `view` and `trace` of the
1,024 x 444 folder under 8 s each; CLI start-up without torch. Earlier (issue 8): the analysis
functions in one process >= 100k events/s, peak < 1 GiB.

The folder (:func:`build_job`): a 2-D TP + FSDP2 transformer runs for real on torch's fake
backend as ranks 0 and 9 (:func:`run_roles`); every rank's dump is rank 0's with its groups
renamed and re-ranked as torch names them, latencies of its own, rank 733 five times slower on
steps 6-7, rank 402 missing one all_reduce at step 8, and (issue 39) rank 300 arriving 60 ms
late at its tensor-parallel group's first call of step 4, its 7 group members waiting for it
there (at another world size, the ranks at the same fraction of it). Then `check` and `report`
in a fresh process each (events/s, peak RSS, the planted faults found: the late rank must be
`report`'s first late rank), the CLI's `check` and `report` per `-j` (wall and CPU seconds),
and (issue 19) `commdebug trace` of every rank and of `--ranks 0-7`, gzip-compressed, and
`commdebug view` of the folder (`--no-trace` skips them).

    python bench/ranks_scale.py [--ranks 1024] [--events 10000] [--keep DIR] [--no-trace]
    python bench/ranks_scale.py --events 0          # the run's own calls (~410 per rank): view and trace

`--events N` cuts the run's calls or continues them by repeating its last step. The real runs
take about 30 s at 1,024 ranks (`--roles DIR` keeps them for the next time); writing 1,024 x
10,000 events about 1.4 GB of disk; `--ranks 64` is a quick look.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_EVENTS_PER_S = 100_000
TARGET_RSS_MB = 1024
TARGET_TRACE_GZ_MB = 100  # the whole job's trace as .json.gz, at 1,024 ranks x 2,000 events
TARGET_TRACE_8_MB = 5     # --ranks 0-7
TP = 8
TARGET_CLI_EVENTS_PER_S = 600_000  # issue 32: the CLI on the 2-core machine, workers included
TARGET_CLI_MIB = 500
TARGET_VIEW_TRACE_S = 8  # issue 32: view and trace of the 1,024 x 444 folder


# ---------------------------------------------------------------------------- a 1,024-rank job from one real run

# Issue 32's job: a 2-D TP + FSDP2 transformer, rank SLOW 5x slower on steps 6-7, rank SKIP missing
# one all_reduce at step 8 (its group's later sequence numbers one less), every other rank its own
# latencies. At another world size the planted ranks sit at the same fraction of the world.
SLOW_FACTOR = 5.0
LATE_S = 0.06  # a late rank's delay (issue 39): its group members wait this long for it (under rank 733's
# slowness, ~0.1 s of straggler time, so that --top still ranks 733 first)
LATE_STEP = 4
LATE_FROM = 64  # ranks from which the late rank is planted
JITTER = 0.02      # each call of each rank: its base latency x uniform(1 - JITTER, 1 + JITTER)
ALPHA_S = 200e-6   # the base latency of a call: ALPHA_S + bytes / bandwidth (a CPU gloo-like fabric;
TP_BPS = 2e9       # the fake backend moves nothing, so its own timings say nothing about the network)
DP_BPS = 0.5e9
TP_PLACEHOLDER, DP_PLACEHOLDER = "@tp-group@", "@dp-group@"


@dataclass(frozen=True)
class Job:
    """What :func:`build_job` wrote: where, how big, and the planted faults."""

    folder: Path
    ranks: int
    steps: int
    events: int  # calls per rank (the skipping rank has one less)
    slow: int  # this rank's calls are SLOW_FACTOR times slower at slow_steps
    slow_steps: tuple[int, ...]
    skip: int  # this rank never issued one all_reduce at skip_step
    skip_step: int
    roles_s: float  # seconds the real runs took
    derive_s: float  # seconds deriving and writing every rank's file took
    roles: tuple[Path, Path]  # the real runs' dumps, for another build_job(..., roles=) of this world size
    late: tuple[tuple[int, int], ...] = ()  # (step, rank): that rank arrived LATE_S late at the step


ROLE_PROGRAM = """
import sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {root!r})
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from commdebug import CommDebugMode
from commdebug.demo import ModelConfig, fsdp_tp_transformer

rank, world, tp, layers, steps, out = {rank}, {world}, {tp}, {layers}, {steps}, {out!r}
dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
torch.manual_seed(0)
cfg = ModelConfig(n_layers=layers, n_heads=8, dim=64)
model = fsdp_tp_transformer(cfg, world // tp, tp)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len), generator=torch.Generator().manual_seed(0))
comm = CommDebugMode(timing="sync")
with comm:
    for _ in range(steps):
        model(tokens).sum().backward()
        optimizer.step()  # the step boundary
        optimizer.zero_grad()
comm.generate_json_dump(out, noise_level=0)
dist.destroy_process_group()
"""


def run_roles(out: Path, world: int, tp: int = TP, layers: int = 4, steps: int = 10) -> tuple[Path, Path]:
    """Play ranks 0 and ``tp + 1`` of a ``world``-rank job (on torch's fake backend, both at once,
    each in its own process) and write their dumps in ``out``: two ranks that share no group, so
    their group names tell how torch names every rank's groups. Every rank of this program plays
    the same role (FSDP2 shards evenly, TP splits evenly): :func:`build_job` checks that the two
    agree on everything but group names and derives the other ranks from rank 0."""
    if world % tp or world < 2 * tp:
        raise SystemExit(f"--ranks must be a multiple of {tp} and at least {2 * tp}")
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in (0, tp + 1):
        program = out / f"train{rank}.py"  # a file, so the calls' source lines name it
        program.write_text(ROLE_PROGRAM.format(root=str(ROOT), rank=rank, world=world, tp=tp, layers=layers, steps=steps,
                                               out=str(out / f"role{rank}.json")), encoding="utf-8")
        procs.append(subprocess.Popen([sys.executable, str(program)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"the fake-backend run failed:\n{err}")
    return out / "role0.json", out / f"role{tp + 1}.json"


def _mesh_groups(trace) -> tuple:
    """(tp group, dp group) of a role's trace, told by DeviceMesh's descriptions."""
    by_desc = {g.desc: g for g in trace.groups.values()}
    try:
        return by_desc["mesh_tp"], by_desc["mesh_dp"]
    except KeyError:
        raise SystemExit(f"expected DeviceMesh groups mesh_tp and mesh_dp, found {sorted(by_desc)}") from None


def _naming(a: int, name_a: str, b: int, name_b: str, index) -> Callable[[int], str]:
    """How torch names the group of each rank, learned from ranks ``a`` and ``b``: group names
    are a counter in creation order, and a mesh dimension's groups are created in order of
    ``index(rank)``."""
    ia, ib = index(a), index(b)
    stride = (int(name_b) - int(name_a)) // (ib - ia)
    base = int(name_a) - ia * stride
    return lambda rank: str(base + index(rank) * stride)


def _signature(trace) -> list[tuple]:
    return [(e.op, e.step, e.phase, e.module, e.group.desc, e.seq, e.size_bytes) for e in trace.events]


def _extend(events: list, count: int | None) -> list:
    """``count`` events: the run's, cut or continued by repeating its last step (the steady
    state), sequence numbers, indices, steps and start times going on."""
    if count is None or count == len(events):
        return events
    if count < len(events):
        return events[:count]
    last = events[-1].step
    period = [e for e in events if e.step == last]
    per_group: dict[str, int] = {}
    for e in period:
        per_group[e.group.name] = per_group.get(e.group.name, 0) + 1
    span = (period[-1].start_s + period[-1].latency_s) - period[0].start_s
    out = list(events)
    rounds = 0
    while len(out) < count:
        rounds += 1
        for e in period:
            if len(out) == count:
                break
            out.append(e._replace(index=len(out), step=last + rounds, seq=e.seq + rounds * per_group[e.group.name],
                                  start_s=e.start_s + rounds * span))
    return out


def _tree_trace(template, events: list):
    """The template's trace with its module tree's counts and bytes those of ``events``."""
    from commdebug.model.trace import GLOBAL

    trace = template
    trace._collectives = {}
    trace._pending = []
    paths: dict[str, tuple[str, ...]] = {}
    for e in events:
        path = paths.get(e.module)
        if path is None:
            chain, fqn = [], e.module if e.module in trace.modules else GLOBAL
            while fqn is not None:
                chain.append(fqn)
                fqn = trace.modules[fqn].parent
            path = paths[e.module] = tuple(chain)
        trace.add_collective(path, e.phase, (e.key, e.op, e.group.name), e.size_bytes)
    trace.events.clear()
    trace.events_total = len(events)
    trace.step = events[-1].step + 1 if events else 0
    return trace


def build_job(folder: Path, ranks: int = 1024, events: int | None = None, *, tp: int = TP, layers: int = 4, steps: int = 10,
              slow: int | None = None, slow_steps: tuple[int, ...] = (6, 7), skip: int | None = None, skip_step: int = 8,
              seed: int = 0, roles: tuple[Path, Path] | None = None, late: dict[int, int] | None = None,
              late_s: float = LATE_S) -> Job:
    """Write a ``ranks``-rank job's dumps in ``folder`` from one real run of a 2-D TP + FSDP2
    transformer (``layers`` blocks, ``steps`` timed steps) on torch's fake backend, with a slow
    rank and a rank that skipped a call planted (issue 32's job at 1,024 ranks).

    Ranks 0 and ``tp + 1`` are played for real (:func:`run_roles`, or ``roles``: their dumps from
    an earlier call at the same world size); every rank's file is rank 0's with its groups renamed
    and re-ranked the way torch names them, and latencies of its own: each call's base latency
    (``ALPHA_S`` + bytes over the TP or DP bandwidth) times ``1 +- JITTER``, drawn per rank and
    call, the gaps between calls (the program's compute) kept. ``events``: calls per rank, the
    run's cut or continued by repeating its last step. ``late``: step -> a rank that comes
    ``late_s`` late to its tensor-parallel group's first call of that step (its gap before the
    call that much longer), the group's other members waiting for it inside the call (their
    latency that much longer). The columns are written directly (the
    rank-independent ones shared): about 10 ms per rank of 10,000 calls.

    >>> job = build_job(Path("job"), 64, layers=2, steps=4, slow_steps=(2, 3), skip_step=3)  # doctest: +SKIP
    >>> job.slow, job.skip
    (45, 25)
    """
    import random
    from itertools import accumulate

    import commdebug
    from commdebug.model.dump import to_dump_dict
    from commdebug.model.events import encode_events
    from commdebug.model.trace import GroupInfo

    try:
        import orjson

        def dumps(obj: Any) -> bytes:
            return orjson.dumps(obj)
    except ImportError:
        def dumps(obj: Any) -> bytes:
            return json.dumps(obj, separators=(",", ":")).encode()

    slow = ranks * 733 // 1024 if slow is None else slow
    skip = ranks * 402 // 1024 if skip is None else skip
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if roles is None:
        roles = run_roles(folder.parent / f".{folder.name}-roles", ranks, tp, layers, steps)
    roles_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    a, b = 0, tp + 1
    ta, tb = commdebug.load(roles[0]), commdebug.load(roles[1])
    if ta.metadata.get("world_size") != ranks:
        raise SystemExit(f"{roles[0]} is a {ta.metadata.get('world_size')}-rank run, not {ranks}")
    (tp_a, dp_a), (tp_b, dp_b) = _mesh_groups(ta), _mesh_groups(tb)
    if [s[:4] + s[5:] for s in _signature(ta)] != [s[:4] + s[5:] for s in _signature(tb)]:
        raise SystemExit(f"ranks {a} and {b} issue different calls: this program has more than one rank role")
    tp_name = _naming(a, tp_a.name, b, tp_b.name, lambda r: r // tp)
    dp_name = _naming(a, dp_a.name, b, dp_b.name, lambda r: r % tp)
    if tp_name(b) != tp_b.name or dp_name(b) != dp_b.name:
        raise SystemExit("torch named the groups in an order this builder does not follow")

    # rank 0's events with placeholder group names, cut or continued to `events` calls
    placeholder = {tp_a.name: GroupInfo(TP_PLACEHOLDER, tp_a.desc, tp_a.size, None),
                   dp_a.name: GroupInfo(DP_PLACEHOLDER, dp_a.desc, dp_a.size, None)}
    base = _extend([e._replace(group=placeholder.get(e.group.name, e.group)) for e in ta.events], events)
    ta.groups = {g.name: g for g in (*placeholder.values(), *(g for n, g in ta.groups.items() if n not in placeholder))}
    steps_out = base[-1].step + 1
    if not (all(s < steps_out for s in slow_steps) and skip_step < steps_out):
        raise SystemExit(f"the planted steps {slow_steps} and {skip_step} must be below the job's {steps_out} steps")

    # the skipping rank's events: its first all_reduce of skip_step never issued
    drop = min(i for i, e in enumerate(base) if e.step == skip_step and e.op == "all_reduce")
    dropped = base[drop].group.name
    skipped = base[:drop] + [e._replace(index=e.index - 1, seq=e.seq - 1 if e.group.name == dropped else e.seq) for e in base[drop + 1:]]

    def head(evs: list) -> dict[str, Any]:
        d = to_dump_dict(_tree_trace(ta, evs), noise_level=0, events=[])
        d["commdebug"]["events_dropped"] = 0
        return d

    def block(evs: list) -> tuple[dict[str, Any], list[float], list[float]]:
        """The events block (latency and start columns filled per rank), the base latencies and
        the gaps between one call's end and the next call's start."""
        blk = encode_events(evs)
        bw = {TP_PLACEHOLDER: TP_BPS, DP_PLACEHOLDER: DP_BPS}
        lat = [ALPHA_S + e.size_bytes / bw.get(e.group.name, DP_BPS) for e in evs]
        starts = [e.start_s for e in evs]
        gaps = [max(0.0, starts[i + 1] - starts[i] - evs[i].latency_s) for i in range(len(evs) - 1)] + [0.0]
        return blk, lat, gaps

    variants = {False: (head(base), *block(base)), True: (head(skipped), *block(skipped))}
    plants = dict(late or {})
    if any(s >= steps_out for s in plants):
        raise SystemExit(f"the late steps {sorted(plants)} must be below the job's {steps_out} steps")
    # per variant and late step: the index of the TP group's first call of the step
    late_at = {flag: {s: min(i for i, e in enumerate(evs) if e.step == s and e.group.name == TP_PLACEHOLDER) for s in plants}
               for flag, evs in ((False, base), (True, skipped))}
    slow_at = [e.step in slow_steps for e in base]
    first_start = base[0].start_s
    mesh_tp, mesh_dp = tp_a.desc, dp_a.desc
    meta_base = dict(ta.metadata)
    for r in range(ranks):
        root, blk, lat, gaps = variants[r == skip]
        rng = random.Random(seed * 1_000_003 + r)
        lo, width = 1 - JITTER, 2 * JITTER
        u = rng.random
        mine = [round(x * (lo + width * u()), 9) for x in lat]
        if r == slow:
            mine = [x * SLOW_FACTOR if s else x for x, s in zip(mine, slow_at, strict=True)]
        mine_gaps, begin = gaps, first_start
        for step, late_rank in plants.items():
            if r // tp != late_rank // tp:
                continue
            i = late_at[r == skip][step]
            if r != late_rank:
                mine[i] += late_s  # waited for it inside the call
            elif i == 0:
                begin += late_s
            else:
                mine_gaps = list(mine_gaps) if mine_gaps is gaps else mine_gaps
                mine_gaps[i - 1] += late_s  # came that much later to it
        ends = [x + g for x, g in zip(mine, mine_gaps, strict=True)]
        start = [round(s, 9) for s in accumulate(ends[:-1], initial=begin)]
        blk["columns"]["latency_s"] = mine
        blk["columns"]["start_s"] = start
        section = root["commdebug"]
        tp0, dp_ranks = r - r % tp, list(range(r % tp, ranks, tp))
        section["groups"] = {TP_PLACEHOLDER: {"desc": mesh_tp, "size": tp, "ranks": list(range(tp0, tp0 + tp))},
                             DP_PLACEHOLDER: {"desc": mesh_dp, "size": len(dp_ranks), "ranks": dp_ranks}}
        section["metadata"] = {**meta_base, "rank": r, "hostname": f"node{r // 8}", "pid": 1000 + r, "steps": steps_out,
                               "derived_from": f"rank {a} of a fake-backend run (bench/ranks_scale.py)"}
        section["events"] = blk
        raw = dumps(root).replace(f'"{TP_PLACEHOLDER}"'.encode(), f'"{tp_name(r)}"'.encode())
        raw = raw.replace(f'"{DP_PLACEHOLDER}"'.encode(), f'"{dp_name(r)}"'.encode())
        (folder / f"rank{r}.json").write_bytes(raw)
    return Job(folder, ranks, steps_out, len(base), slow, tuple(slow_steps), skip, skip_step, roles_s, time.perf_counter() - t0, roles,
               tuple(sorted(plants.items())))


CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from commdebug.analysis.{module} import {func}
t0 = time.perf_counter()
result = {func}({folder!r})
dt = time.perf_counter() - t0
extra = {extra}
print(json.dumps({{"seconds": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "extra": extra}}))
"""


def _measure(module: str, func: str, folder: Path, extra: str) -> dict:
    code = CHILD.format(root=str(ROOT), module=module, func=func, folder=str(folder), extra=extra)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{func} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _timed_cli(*args: str) -> tuple[float, float, str]:
    """`commdebug ARGS` in a fresh process: (wall seconds, CPU seconds of it and its workers,
    stdout); exits with its stderr if it fails."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"commdebug {' '.join(args)} failed:\n{proc.stderr}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def _cli_peak(*args: str) -> tuple[float, float, float]:
    """`commdebug ARGS` in a fresh process: (wall seconds, CPU seconds of it and its workers (user +
    sys), peak RSS in MiB of the largest process it or its workers reached); ru_maxrss of
    waited-for children is the largest of them, not a sum."""
    import resource

    code = "import resource, sys, commdebug.cli as c; rc = c.main(sys.argv[1:]); " \
           "print(max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024, file=sys.stderr); sys.exit(rc)"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"commdebug {' '.join(args)} failed:\n{proc.stderr}")
    return seconds, cpu, float(proc.stderr.strip().splitlines()[-1])


def startup() -> None:
    """`commdebug --help` and `--version`: best of 5 fresh processes, ms and peak RSS."""
    import resource

    for flag in ("--help", "--version"):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "commdebug", flag], capture_output=True, check=True, cwd=ROOT)
            best = min(best, time.perf_counter() - t0)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"commdebug {flag:9}: {best * 1e3:.0f} ms (best of 5), peak RSS {rss:.0f} MiB")


def cli_rates(folder: Path, total: int, jobs: tuple[int, ...]) -> None:
    """`commdebug check` and `report` of the folder with each -j: events/s of wall time and of CPU
    time (the process and its workers: what the figure would be on idle cores), peak RSS."""
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    for verb in ("check", "report"):
        for j in jobs:
            seconds, cpu, rss = _cli_peak(verb, str(folder), "-q", "-j", str(j))
            rate = total / seconds
            print(f"commdebug {verb} -j {j}: {seconds:.1f} s wall, {rate:,.0f} events/s (target >= {TARGET_CLI_EVENTS_PER_S:,}: "
                  f"{rate / TARGET_CLI_EVENTS_PER_S:.2f}x); {cpu:.1f} s CPU, {total / cpu:,.0f} events per CPU-second; "
                  f"peak {rss:.0f} MiB per process (target <= {TARGET_CLI_MIB})")


def trace_and_view(folder: Path, out: Path) -> None:
    """Print the sizes and times of the job's traces (all ranks, ranks 0-7) and its folder page."""
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for what, options, target in (("trace, every rank", [], TARGET_TRACE_GZ_MB), ("trace --ranks 0-7", ["--ranks", "0-7"], TARGET_TRACE_8_MB)):
        path = out / f"trace{len(options)}.json.gz"
        seconds, cpu, stdout = _timed_cli("trace", str(folder), "-o", str(path), "--quiet", *options)
        mb = path.stat().st_size / 1e6
        with gzip.open(path, "rb") as f:
            raw = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
        print(f"{what:18}: {mb:.1f} MB as .json.gz ({raw / 1e6:.0f} MB of JSON), written in {seconds:.1f} s wall, {cpu:.1f} s CPU "
              f"(target < {target} MB: {mb / target:.2f}x; < {TARGET_VIEW_TRACE_S} s at 1,024 x 444)")
        print(f"  {stdout.splitlines()[0]}")
    seconds, cpu, _ = _timed_cli("view", str(folder), "-o", str(out / "index.html"), "--quiet")
    print(f"view              : {(out / 'index.html').stat().st_size / 2**20:.2f} MiB page, written in {seconds:.1f} s wall, "
          f"{cpu:.1f} s CPU (target < {TARGET_VIEW_TRACE_S} s at 1,024 x 444)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--events", type=int, default=10_000, help="calls per rank (0: the run's own)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10, help="steps the real run takes")
    ap.add_argument("--keep", type=Path, help="write the folder here and keep it")
    ap.add_argument("--roles", type=Path, help="keep the real runs' dumps here (and reuse them when there)")
    ap.add_argument("--no-trace", dest="trace", action="store_false", help="skip the trace and view figures")
    ap.add_argument("--jobs", default="1,2", help="the -j values to time the CLI's check and report with (default 1,2)")
    args = ap.parse_args()
    startup()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="commdebug-ranks-"))
    folder.mkdir(parents=True, exist_ok=True)
    roles_dir = args.roles or Path(tempfile.mkdtemp(prefix="commdebug-roles-"))
    try:
        tp = TP
        roles = (roles_dir / "role0.json", roles_dir / f"role{tp + 1}.json")
        if not all(p.exists() for p in roles) or json.loads(roles[0].read_bytes())["commdebug"]["metadata"]["world_size"] != args.ranks:
            t0 = time.perf_counter()
            roles = run_roles(roles_dir, args.ranks, tp, args.layers, args.steps)
            print(f"real runs (ranks 0 and {tp + 1} of {args.ranks}, fake backend): {time.perf_counter() - t0:.0f} s")
        # a late rank's group stands apart (it and the members that waited for it): in a world of
        # a few groups that is most of it, so the plant needs LATE_FROM ranks
        late = {LATE_STEP: args.ranks * 300 // 1024} if args.ranks >= LATE_FROM else None
        job = build_job(folder, args.ranks, args.events or None, tp=tp, roles=roles, late=late)
        size = sum(p.stat().st_size for p in folder.iterdir())
        total = args.ranks * job.events - 1  # the skipping rank has one less
        print(f"folder: {args.ranks} ranks x {job.events} events = {total:,} events ({job.steps} steps), {size / 2**20:.0f} MiB, "
              f"derived and written in {job.derive_s:.1f} s ({job.derive_s / args.ranks * 1e3:.1f} ms per rank)")
        check = _measure("check", "check_path", folder,
                         "[(f.kind, f.group, f.seq, [s.ranks for s in f.sides]) for f in result.findings]")
        report = _measure("report", "report_path", folder,
                          "[[[r.rank, [w.step for w in r.worst_steps[:2]]] for r, _ in result.top(16)],"
                          " [[e.step, e.rank, e.worst.caused_s] for e in result.late.entries[:3]]]")
        for name, m in (("check", check), ("report", report)):
            rate = total / m["seconds"]
            print(f"{name:6}: {m['seconds']:.1f} s, {rate:,.0f} events/s (target >= {TARGET_EVENTS_PER_S:,}: "
                  f"{rate / TARGET_EVENTS_PER_S:.2f}x), peak RSS {m['rss_mb']:.0f} MiB (target < {TARGET_RSS_MB}: {m['rss_mb'] / TARGET_RSS_MB:.2f}x)")
        cli_rates(folder, total, tuple(int(j) for j in args.jobs.split(",")))
        findings = check["extra"]
        skip_found = any(kind in ("missing", "diverged", "mismatch") and [job.skip] in sides for kind, _, _, sides in findings)
        print(f"planted skip on rank {job.skip}: {'found' if skip_found else 'NOT FOUND'} ({len(findings)} finding(s): {findings[:3]})")
        # the late rank and the members that waited for it stand apart too (by the wait caused,
        # by the time waited): the slow rank must come first among the other ranks
        top, late_named = report["extra"]
        late_group = {late_rank // tp for _, late_rank in job.late}
        others = [(rank, steps) for rank, steps in top if rank // tp not in late_group]
        slow_found = others[:1] == [(job.slow, others[0][1])] and sorted(others[0][1]) == sorted(job.slow_steps)
        print(f"planted slow rank {job.slow} (steps {'-'.join(map(str, job.slow_steps))}): "
              f"{'ranked first outside the late rank' + chr(39) + 's group, at those steps' if slow_found else 'NOT FOUND'} "
              f"(report's top: {top[:4]})")
        if job.late:
            late_found = [tuple(e[:2]) for e in late_named[:1]] == [job.late[0]]
            print(f"planted late rank {job.late[0][1]} (step {job.late[0][0]}, {LATE_S * 1e3:.0f} ms): "
                  f"{'named first' if late_found else 'NOT NAMED FIRST'} (report's late ranks: {late_named})")
        else:
            late_found = not late_named
            print(f"planted late rank: none below {LATE_FROM} ranks; report's late ranks: {late_named or 'none'}")
        if not (skip_found and slow_found and late_found):
            raise SystemExit(1)
        if args.trace:
            with tempfile.TemporaryDirectory() as out:
                trace_and_view(folder, Path(out))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        if not args.roles:
            shutil.rmtree(roles_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
