"""How close does `commdebug estimate` come to measured time on programs it was not calibrated on?

On N gloo ranks (mp spawn, this machine's CPU), every rank runs, each under
CommDebugMode(timing="sync"):

1. the calibration program: all_reduce, all_gather_into_tensor and reduce_scatter_tensor on the
   world group at message sizes every half power of two from 256 B to the largest size, back to
   back, in an order shuffled each run;
2. five held-out programs, none of which is the calibration program: a tensor-parallel MLP
   (DTensor, forward + backward + SGD), FSDP2 with AdamW, a mixed-size all_reduce loop, an
   all_gather-heavy and a reduce_scatter-heavy step (each with compute between the calls).

The calibration and every program run --runs times, interleaved (run 1 of each, then run 2 of
each, ..., in an order shuffled each run), so that both sides see the same moments of a shared
machine. Then, offline, `commdebug calibrate` fits the cluster from the calibration runs' dumps
and `commdebug estimate` puts each held-out program's measured time beside the prediction: error
per program, per op, per op x size bin and in total, with the old alpha-beta model's for
comparison. Measured: each call's shortest latency over the ranks (its duration once the last
member arrived), then one statistic over the runs (--statistic, default p10: the 10th
percentile); each calibration point is the same statistic of the same number of runs, then the points are made
non-decreasing in size by pooling (commdebug/estimate/calibrate.py: monotone).

How the held-out programs were chosen: they are the five kinds the issue (#33) lists, with
shapes and sizes written down in this file before any fit was run and not changed after seeing
an error; their message sizes fall inside the calibration sweep but are mostly not on its
points (odd multiples of 1.5 KiB, model shapes). What the second round of work changed, after
the first round's errors (-6% to -65%, all negative), is the measurement, never the programs:
runs interleaved instead of the calibration first; the same statistic over the same number of
runs on both sides (it was the minimum over 11 calibration repeats against 9 program runs);
calibration points pooled into a non-decreasing curve instead of lowered to a running minimum;
the 10th percentile instead of the minimum (which picks a call whose last member found its data
already sent); 61 runs instead of 9-11 (with 21, two runs of the bench differed by up to 32
points on one program). Each change has a cause measured on the calibration's own samples or on
the spread between repeated runs of the bench (docs/estimate.md). In fairness: the 10th
percentile was picked among the minimum, the 10th and 25th percentiles and the median after
seeing, besides the outliers, each one's errors on one earlier run of this bench; the figures
in docs/estimate.md come from later runs. The calibration program was designed from what the
programs need in general (each op they use, a sweep covering their sizes, the group size and
process count they run on), not from their errors. --gaps also runs the sweep with compute
after each call (a 64x64 and a 256x256 matmul, sizes picked before measuring) and prints the
errors calibrated from those: whether compute between calls changes what a call costs. The
table keeps the back-to-back sweep, designed first.

    python bench/predict_accuracy.py                      # 2 and 4 ranks, sizes up to 4 MiB, 61 runs (about 4 minutes)
    python bench/predict_accuracy.py --ranks 2 --quick    # what the tests run (seconds)

Prints markdown tables; --out keeps the dumps and the fitted cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ports import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HELD_OUT = ("tp_mlp", "fsdp2_adamw", "mixed_all_reduce", "all_gather_heavy", "reduce_scatter_heavy")
TOTAL_TARGET, BIN_TARGET = 0.10, 0.25


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


# ---- the programs (run on every rank) --------------------------------------------------------


def sweep_sizes(lo: int, hi: int) -> list[int]:
    """Every half power of two from lo to hi bytes, rounded to whole float32 x 8 ranks."""
    out, k = [], 0
    while True:
        s = int(round(lo * 2 ** (k / 2) / 32)) * 32
        if s > hi:
            return out
        if not out or s > out[-1]:
            out.append(s)
        k += 1


# Each program sets up outside the recording and returns one step, which is recorded.


def calibration(cfg: dict, world: int, rank: int, gap: int = 0):
    sizes = sweep_sizes(cfg["min_size"], cfg["max_size"])
    bufs = {s: torch.ones(s // 4) for s in sizes}
    order = random.Random(0)  # the same order on every rank, a new one each run
    a = torch.randn(gap, gap) if gap else None

    def step() -> None:
        for op in order.sample(["all_reduce", "all_gather", "reduce_scatter"], 3):
            for s in order.sample(sizes, len(sizes)):
                if op == "all_reduce":
                    dist.all_reduce(bufs[s])
                elif op == "all_gather":
                    dist.all_gather_into_tensor(torch.empty(s // 4), bufs[s][: s // 4 // world])
                else:
                    dist.reduce_scatter_tensor(torch.empty(s // 4 // world), bufs[s])
                if a is not None:
                    a.mm(a)

    return step


def tp_mlp(cfg: dict, world: int, rank: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dim, tokens = cfg["tp_dim"], cfg["tp_tokens"]
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim),
                              torch.nn.Linear(dim, 2 * dim), torch.nn.ReLU(), torch.nn.Linear(2 * dim, dim))
    mlp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                                         "3": ColwiseParallel(), "5": RowwiseParallel()})
    opt = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    x = torch.randn(tokens, dim, requires_grad=True)

    def step() -> None:
        mlp(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def fsdp2_adamw(cfg: dict, world: int, rank: int):
    from torch.distributed.fsdp import fully_shard

    dim = cfg["fsdp_dim"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.Tanh()) for _ in range(4)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, dim)

    def step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def mixed_all_reduce(cfg: dict, world: int, rank: int):
    rng = random.Random(1234)  # the same sizes on every rank
    lo, hi = cfg["min_size"] * 3, cfg["max_size"] // 2
    sizes = [int(lo * (hi / lo) ** rng.random()) // 32 * 32 for _ in range(cfg["mixed_calls"])]
    w0 = torch.randn(128, 128)

    def step() -> None:
        w = w0
        for s in sizes:
            t = torch.ones(s // 4)
            dist.all_reduce(t)
            w = torch.tanh(w @ w)  # compute between the calls, as a training loop has

    return step


def _heavy_sizes(cfg: dict) -> list[int]:
    # 1.5 x powers of two: between the calibration's points, fixed before the fit
    top = cfg["max_size"] // 2
    return [s for s in (int(1.5 * (1 << k)) // 32 * 32 for k in range(10, 24)) if 3 * cfg["min_size"] <= s <= top][::2]


def all_gather_heavy(cfg: dict, world: int, rank: int):
    w0 = torch.randn(128, 128)

    def step() -> None:
        w = w0
        for s in _heavy_sizes(cfg):
            shard = torch.ones(s // 4 // world)
            out = torch.empty(s // 4)
            dist.all_gather_into_tensor(out, shard)
            w = torch.tanh(w @ w) + out[:1].sum()

    return step


def reduce_scatter_heavy(cfg: dict, world: int, rank: int):
    w0 = torch.randn(128, 128)

    def step() -> None:
        w = w0
        for s in _heavy_sizes(cfg):
            full = torch.ones(s // 4)
            out = torch.empty(s // 4 // world)
            dist.reduce_scatter_tensor(out, full)
            w = torch.tanh(w @ w) + out[:1].sum()

    return step


PROGRAMS = {"calibration": calibration, "calibration_gap64": lambda c, w, r: calibration(c, w, r, 64),
            "calibration_gap256": lambda c, w, r: calibration(c, w, r, 256), "tp_mlp": tp_mlp, "fsdp2_adamw": fsdp2_adamw, "mixed_all_reduce": mixed_all_reduce,
            "all_gather_heavy": all_gather_heavy, "reduce_scatter_heavy": reduce_scatter_heavy}


def worker(rank: int, world: int, port: int, out: str, cfg: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # N ranks share this machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import warnings

    from commdebug import CommDebugMode

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename
    try:
        names = [*cfg["calibrations"], *cfg["programs"]]
        steps = {}
        for name in names:
            steps[name] = PROGRAMS[name](cfg, world, rank)
            steps[name]()  # connections, FSDP's lazy init, allocator: before anything is timed
        # The runs interleave the calibration and the programs (in an order that changes from
        # run to run, the same on every rank), so that both see the same moments of a shared
        # machine: a calibration taken in a quiet minute predicts a busy one's programs low.
        order = random.Random(world)
        for run in range(cfg["runs"]):
            order.shuffle(names)
            for name in names:
                dist.barrier()
                comm = CommDebugMode(timing="sync")
                with comm:
                    for _ in range(1 if name.startswith("calibration") else cfg["steps"]):
                        steps[name]()
                folder = os.path.join(out, name, f"run{run}")
                os.makedirs(folder, exist_ok=True)
                comm.generate_json_dump(os.path.join(folder, f"rank{rank}.json"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ---- offline: calibrate, predict, compare ------------------------------------------------------


def evaluate(out: Path, programs: list[str], statistic: str, calibration_program: str = "calibration") -> dict:
    """Fit from the calibration run, then each held-out program measured beside predicted."""
    from commdebug.analysis.predicted import compare_measured
    from commdebug.estimate import PRESETS, load_cluster
    from commdebug.estimate.calibrate import calibrate
    from commdebug.estimate.cluster import Cluster
    from commdebug.estimate.timed import timed_calls
    from commdebug.fileio import write_output
    from commdebug.formats.readers import iter_ranks

    cal = [timed_calls(iter_ranks(run), source=str(run)) for run in sorted((out / calibration_program).iterdir())]
    cluster, _ = calibrate(cal, base=PRESETS["h100-ib400"], name="this-machine-gloo", statistic=statistic)
    path = write_output(out / ("cluster.json" if calibration_program == "calibration" else f"cluster_{calibration_program}.json"), json.dumps(cluster.to_dict(), indent=1) + "\n")
    round_trip = load_cluster(path) == cluster
    # the same links without curves: the model before this one (one line per link)
    plain = Cluster(cluster.name + "-alpha-beta", cluster.gpus_per_node, cluster.intra_node, cluster.network)
    result: dict = {"cluster": str(path), "round_trip": round_trip, "curves": len(cluster.curves), "programs": {}}
    for name in programs:
        job = of_runs([timed_calls(iter_ranks(run), source=str(run)) for run in sorted((out / name).iterdir())], statistic)
        c = compare_measured(job, cluster, by=("op", "op,bin"))
        old = compare_measured(job, plain, by=())
        assert c is not None and old is not None
        result["programs"][name] = {
            "calls": c.total.calls, "measured_s": c.total.measured_s, "predicted_s": c.total.predicted_s,
            "error": c.total.error, "alpha_beta_error": old.total.error, "sources": c.sources,
            "per_op": [r.to_dict() for r in c.tables["op"]],
            "per_bin": [{**r.to_dict(), "size_bin": list(r.key["size_bin"])} for r in c.tables["op,bin"]],
        }
    return result


def of_runs(jobs: list, statistic: str):
    """One job whose calls take, each, ``statistic`` (the same one the calibration's points
    take) of its times over the repeated runs of the same program (the runs issue the same
    calls in the same order; each time is already the call's shortest latency over the ranks)."""
    from commdebug.estimate.calibrate import STATISTICS
    from commdebug.estimate.timed import TimedCall

    first = jobs[0]
    for job in jobs[1:]:
        same = [(c.event.op, c.event.size_bytes) for c in job.calls] == [(c.event.op, c.event.size_bytes) for c in first.calls]
        if not same:
            raise SystemExit(f"{job.source}: the runs of one program issued different calls")
    stat = STATISTICS[statistic]
    calls = [TimedCall(c.event, c.rank, float(stat([j.calls[i].seconds for j in jobs])), c.ranks_timed)
             for i, c in enumerate(first.calls)]
    first.calls = calls
    return first


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:+.1f}%"


def report(world: int, result: dict) -> str:
    from commdebug.units import format_bytes, format_duration

    lines = [f"### {world} gloo ranks", "",
             f"calibrated: {result['curves']} measured curves; the cluster file round-trips: {result['round_trip']}", "",
             "| program | calls | measured | predicted | error | per op | worst op x size bin | alpha-beta error |",
             "|---|---|---|---|---|---|---|---|"]
    ok = True
    for name, p in result["programs"].items():
        per_op = ", ".join(f"{r['op']} {_pct(r['error'])}" for r in p["per_op"])
        bins = [b for b in p["per_bin"] if b["error"] is not None]
        worst = max(bins, key=lambda b: abs(b["error"]), default=None)
        worst_text = "-" if worst is None else f"{worst['op']} {format_bytes(worst['size_bin'][0])}: {_pct(worst['error'])}"
        lines.append(f"| {name} | {p['calls']} | {format_duration(p['measured_s'])} | {format_duration(p['predicted_s'])} |"
                     f" {_pct(p['error'])} | {per_op} | {worst_text} | {_pct(p['alpha_beta_error'])} |")
        ok &= p["error"] is not None and abs(p["error"]) <= TOTAL_TARGET
        ok &= all(abs(b["error"]) <= BIN_TARGET for b in bins)
    within = sum(abs(b["error"]) <= BIN_TARGET for p in result["programs"].values() for b in p["per_bin"] if b["error"] is not None)
    count = sum(b["error"] is not None for p in result["programs"].values() for b in p["per_bin"])
    lines += ["", f"op x size bins within {BIN_TARGET:.0%}: {within} of {count};"
              f" targets (total within {TOTAL_TARGET:.0%}, every bin within {BIN_TARGET:.0%}): {'met' if ok else 'NOT met'}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--quick", action="store_true", help="small sizes and few repeats: what the tests run")
    ap.add_argument("--programs", nargs="+", default=list(HELD_OUT), choices=HELD_OUT)
    ap.add_argument("--out", default=None, help="keep the dumps and cluster.json here (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="also print each world's result as one JSON line")
    ap.add_argument("--runs", type=int, default=None, help="runs of the calibration and of each program (default 61; --quick 5)")
    ap.add_argument("--statistic", choices=("median", "min", "p10"), default="p10",
                    help="one time per calibration size and per held-out call from the runs (the same on both sides)")
    ap.add_argument("--gaps", action="store_true",
                    help="also run the calibration sweep with a 64x64 and a 256x256 matmul after each call (compute between"
                         " calls) and print each program's error when calibrated from those instead")
    args = ap.parse_args(argv)
    if args.quick:
        cfg = dict(min_size=256, max_size=256 << 10, runs=5, steps=1, tp_dim=32, tp_tokens=64, fsdp_dim=64, mixed_calls=24)
    else:
        cfg = dict(min_size=256, max_size=4 << 20, runs=61, steps=2, tp_dim=128, tp_tokens=512, fsdp_dim=256, mixed_calls=60)
    if args.runs:
        cfg["runs"] = args.runs
    cfg["programs"] = list(args.programs)
    cfg["calibrations"] = ["calibration", *(["calibration_gap64", "calibration_gap256"] if args.gaps else [])]
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="predict_accuracy_"))
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; sizes {cfg['min_size']} B to {cfg['max_size']} B;"
          f" {cfg['runs']} runs, each of the calibration and of every held-out program, interleaved;"
          f" measured = each call's shortest latency over the ranks, then the {args.statistic} over the runs"
          f" (calibration points: the same); load average at the start: {_load()}")
    for world in args.ranks:
        out = base / f"{world}ranks"
        out.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        mp.start_processes(worker, args=(world, free_port(), str(out), cfg), nprocs=world, join=True, start_method="spawn")
        result = evaluate(out, list(args.programs), args.statistic)
        print()
        print(report(world, result), end="")
        for other in cfg["calibrations"][1:]:
            alt = evaluate(out, list(args.programs), args.statistic, other)
            result.setdefault("alternatives", {})[other] = {k: p["error"] for k, p in alt["programs"].items()}
            print(f"calibrated from {other} instead: " + ", ".join(f"{k} {_pct(p['error'])}" for k, p in alt["programs"].items()))
        print(f"(ran in {time.perf_counter() - start:.0f} s; load average after: {_load()}; dumps in {out})")
        if args.json:
            print(json.dumps({"world": world, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
