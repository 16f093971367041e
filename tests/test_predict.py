"""The prediction that follows measurements (issue 33): calibrate from timed dumps (ours and
Flight Recorder's), curves interpolated in log-log and extrapolated by step counts, measured
beside predicted in `commdebug estimate`, and the accuracy bench on a real 2-rank gloo run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from commdebug import ops
from commdebug.errors import CommDebugError
from commdebug.estimate import PRESETS, Cluster, load_cluster, predict_events
from commdebug.estimate.calibrate import calibrate
from commdebug.estimate.curves import Curve
from commdebug.estimate.timed import timed_calls
from commdebug.formats.readers import iter_ranks
from commdebug.model.trace import CollectiveEvent, GroupInfo

ROOT = Path(__file__).resolve().parents[1]
H100 = PRESETS["h100-ib400"]


def event(op: str, size: int, ranks: tuple[int, ...]) -> CollectiveEvent:
    group = GroupInfo("g" + str(len(ranks)), "", len(ranks), ranks)
    return CollectiveEvent(0, op, op, op, 0, "forward", "Global", group, 0, "float32", (), (), size, size, size,
                           ops.spec_for_op(op).busbw_factor(len(ranks)))


def with_curves(*curves: Curve, per_node: int = 8) -> Cluster:
    return Cluster("measured", per_node, H100.intra_node, H100.network, curves=curves)


AR8 = Curve("all_reduce", "intra_node", 8, 8, (4096, 65536, 1 << 20, 16 << 20), (20e-6, 40e-6, 200e-6, 2.5e-3), (9, 9, 9, 9))


def test_a_measured_size_returns_the_measured_point_exactly_and_says_so():
    cluster = with_curves(AR8)
    for size, seconds in zip(AR8.sizes, AR8.seconds, strict=True):
        pred = predict_events([event("all_reduce", size, tuple(range(8)))], cluster)
        assert pred.seconds == [seconds]
        assert pred.sources[0].kind == "measured" and "all_reduce on 8 ranks" in pred.sources[0].text


def test_between_measured_sizes_the_curve_is_a_straight_line_in_log_log():
    cluster = with_curves(AR8)
    (t,) = predict_events([event("all_reduce", 256 << 10, tuple(range(8)))], cluster).seconds
    # 256 KiB is halfway (in log) between 64 KiB and 1 MiB: the geometric mean of their times
    assert t == pytest.approx(math.sqrt(40e-6 * 200e-6))
    pred = predict_events([event("all_reduce", 100_000, tuple(range(8)))], cluster)
    assert 40e-6 < pred.seconds[0] < 200e-6 and pred.sources[0].kind == "interpolated"
    # the alpha-beta line of the same points does not go through them
    a, bw = AR8.fit
    assert a + (256 << 10) * AR8.f / bw != pytest.approx(t, rel=0.02)
    assert len(AR8.residuals()) == 4 and set(AR8.regimes()) <= {"latency-bound", "ramp", "bandwidth-bound"}


def test_from_8_to_64_ranks_the_latency_follows_the_ring_steps_and_the_bytes_the_busbw_factor():
    cluster = with_curves(AR8, per_node=64)  # 64 ranks in one node: the same link
    size = 1 << 20
    pred = predict_events([event("all_reduce", size, tuple(range(64)))], cluster)
    lat = AR8.latency_s
    expected = lat / 14 * 126 + (200e-6 - lat) * (2 * 63 / 64) / (2 * 7 / 8)  # 2(n-1) steps: 14 -> 126
    assert pred.seconds[0] == pytest.approx(expected)
    assert pred.sources[0].kind == "extrapolated" and "2(n-1)" in pred.sources[0].text and "126" in pred.sources[0].text
    # all_gather / reduce_scatter: (n-1) steps
    ag = Curve("all_gather", "intra_node", 8, 8, (8192, 1 << 20), (15e-6, 100e-6), (5, 5))
    (t,) = predict_events([event("all_gather", 8192, tuple(range(64)))], with_curves(ag, per_node=64)).seconds
    assert t == pytest.approx(ag.latency_s / 7 * 63 + (15e-6 - ag.latency_s) * (63 / 64) / (7 / 8))
    # across nodes NCCL's all_reduce takes the tree: 2(log2 nodes + k - 1) steps, fewer than the ring's
    net = Curve("all_reduce", "network", 16, 8, (4096, 1 << 20), (30e-6, 400e-6), (5, 5))
    tree = predict_events([event("all_reduce", 4096, tuple(range(64)))], with_curves(net))
    assert "tree" in tree.sources[0].text
    assert tree.seconds[0] == pytest.approx(net.latency_s / 16 * 20 + (30e-6 - net.latency_s) * (2 * 63 / 64) / (2 * 15 / 16))


def test_ops_without_a_curve_use_the_links_and_presets_say_their_model():
    pred = predict_events([event("broadcast", 1 << 20, tuple(range(8)))], with_curves(AR8))
    assert pred.sources[0].kind == "alpha-beta"
    assert pred.seconds == predict_events([event("broadcast", 1 << 20, tuple(range(8)))], H100).seconds
    assert H100.model.startswith("alpha-beta") and with_curves(AR8).model.startswith("measured curves")
    # reduce_scatter from the all_gather curve: same ring steps and factor
    ag = Curve("all_gather", "intra_node", 8, 8, (8192, 1 << 20), (15e-6, 100e-6), (5, 5))
    rs = predict_events([event("reduce_scatter", 8192, tuple(range(8)))], with_curves(ag))
    assert rs.seconds == pytest.approx([15e-6]) and "all_gather on 8 ranks" in rs.sources[0].text


def fr_rank(rank: int, calls: list[tuple[int, float]]) -> dict:
    """Flight Recorder's JSON form for one rank: all_reduces of float32 at (bytes, duration_ms)."""
    entries = [{"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": i + 1,
                "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": "nccl:all_reduce", "time_created_ns": i,
                "input_sizes": [[size // 4]], "input_dtypes": ["Float"], "output_sizes": [[size // 4]],
                "output_dtypes": ["Float"], "state": "completed", "duration_ms": ms, "is_p2p": False,
                "frames": []} for i, (size, ms) in enumerate(calls)]
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_enqueued_collective": len(calls), "last_started_collective": len(calls),
                                "last_completed_collective": len(calls)}}, "entries": entries}


def test_calibrate_on_flight_recorder_dumps_takes_each_calls_shortest_duration_over_the_ranks(tmp_path):
    sizes = [1024, 8192, 65536, 524288] * 3  # each size three times
    fast = {1024: 0.02, 8192: 0.03, 65536: 0.08, 524288: 0.5}  # ms, the call's own duration
    rank0 = [(s, fast[s] + (0.3 if i % 2 else 0.0)) for i, s in enumerate(sizes)]  # rank 0 waited on odd calls
    rank1 = [(s, fast[s] + (0.0 if i % 2 else 0.4)) for i, s in enumerate(sizes)]  # rank 1 on even ones
    folder = tmp_path / "fr"
    folder.mkdir()
    for r, calls in enumerate((rank0, rank1)):
        (folder / f"fr_trace_{r}.json").write_text(json.dumps(fr_rank(r, calls)))
    job = timed_calls(iter_ranks(folder), source=str(folder))
    assert len(job.calls) == 12 and all(c.ranks_timed == 2 for c in job.calls)
    assert [c.seconds for c in job.calls] == pytest.approx([fast[s] / 1e3 for s in sizes])
    cluster, notes = calibrate([job], base=H100)
    (curve,) = cluster.curves
    assert (curve.op, curve.link, curve.ranks) == ("all_reduce", "intra_node", 2)
    assert curve.sizes == (1024, 8192, 65536, 524288) and curve.calls == (3, 3, 3, 3)
    assert curve.seconds == pytest.approx([fast[s] / 1e3 for s in curve.sizes])
    assert any("shortest latency over the ranks" in n for n in notes)
    # the prediction at a measured size is that measurement
    (t,) = predict_events([event("all_reduce", 65536, (0, 1))], cluster, ranks_per_node=2).seconds
    assert t == pytest.approx(0.08e-3)


def test_a_size_measured_slower_than_a_larger_one_is_pooled_with_it_not_lowered_to_it(tmp_path):
    # the minimum over repeats at 8 KiB came out above 64 KiB's: noise, pooled into their mean;
    # the 1 KiB point stays (a running minimum would have dragged every size down to 0.05 ms)
    calls = [(1024, 0.04), (8192, 0.12), (65536, 0.06), (524288, 0.5)] * 2
    folder = tmp_path / "fr"
    folder.mkdir()
    for r in (0, 1):
        (folder / f"fr_trace_{r}.json").write_text(json.dumps(fr_rank(r, calls)))
    cluster, _ = calibrate([timed_calls(iter_ranks(folder), source=str(folder))], base=H100, statistic="min")
    (curve,) = cluster.curves
    assert curve.seconds == pytest.approx([0.04e-3, 0.09e-3, 0.09e-3, 0.5e-3])


def test_p10_leaves_out_a_lone_call_far_below_the_rest_that_the_minimum_takes(tmp_path):
    # 12 calls at 1 MiB: one whose last member found its data already sent (0.15 ms), the rest near 0.7 ms
    times = [0.15, 0.70, 0.75, 0.77, 0.78, 0.87, 0.90, 0.96, 1.0, 1.1, 1.2, 3.0]
    folder = tmp_path / "fr"
    folder.mkdir()
    for r in (0, 1):
        (folder / f"fr_trace_{r}.json").write_text(json.dumps(fr_rank(r, [(1 << 20, t) for t in times] + [(4 << 20, 3.5)])))
    job = timed_calls(iter_ranks(folder), source=str(folder))
    points = {stat: calibrate([job], base=H100, statistic=stat)[0].curves[0].seconds[0] for stat in ("min", "p10", "median")}
    assert points == {"min": pytest.approx(0.15e-3), "p10": pytest.approx(0.70e-3), "median": pytest.approx(0.885e-3)}


def test_a_cluster_file_keeps_the_curves_points_fit_and_residuals(tmp_path):
    cluster = with_curves(AR8)
    data = cluster.to_dict()
    (c,) = data["curves"]
    assert [p["size_bytes"] for p in c["points"]] == list(AR8.sizes) and {"residual", "regime"} <= set(c["points"][0])
    assert c["fit"]["latency_us"] > 0 and c["fit"]["busbw_gbps"] > 0
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    assert load_cluster(path) == cluster
    c["points"][1]["seconds"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(CommDebugError, match=r"curves\[0\]: points\[1\].seconds must be a number > 0"):
        load_cluster(path)


# ---- one real 2-rank gloo run: the accuracy bench's smallest configuration ----------------------


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("accuracy")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "predict_accuracy.py"), "--ranks", "2", "--quick",
                           "--programs", "mixed_all_reduce", "--out", str(out), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "2ranks", proc.stdout


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.proc
def test_accuracy_bench_prints_its_error_table_and_its_cluster_round_trips(bench_run):
    out, stdout = bench_run
    assert "| program | calls | measured | predicted | error |" in stdout
    row = next(line for line in stdout.splitlines() if line.startswith("| mixed_all_reduce |"))
    assert "%" in row and "all_reduce" in row
    result = json.loads(next(line for line in stdout.splitlines() if line.startswith("{")))
    assert result["round_trip"] is True and result["curves"] == 3  # all_reduce, all_gather, reduce_scatter
    p = result["programs"]["mixed_all_reduce"]
    assert p["calls"] == 24 and p["error"] == pytest.approx((p["predicted_s"] - p["measured_s"]) / p["measured_s"])
    assert "within 25%" in stdout and ("met" in stdout)


@pytest.mark.proc
def test_cli_calibrate_on_a_folder_of_timed_dumps_and_estimate_beside_measured(bench_run, tmp_path):
    out, _ = bench_run
    cluster_file = tmp_path / "gloo.json"
    proc = cli("calibrate", str(out / "calibration" / "run0"), "--base", "h100-ib400", "-o", str(cluster_file))
    assert proc.returncode == 0, proc.stderr
    assert "3 measured curves" in proc.stdout and "shortest latency over the ranks" in proc.stderr
    cluster = load_cluster(cluster_file)
    assert sorted(c.op for c in cluster.curves) == ["all_gather", "all_reduce", "reduce_scatter"]
    assert all(c.ranks == 2 and c.link == "intra_node" and len(c.sizes) > 10 for c in cluster.curves)
    held_out = out / "mixed_all_reduce" / "run0"
    text = cli("estimate", str(held_out), "--cluster", str(cluster_file))
    assert text.returncode == 0, text.stderr
    assert "measured beside predicted" in text.stdout and "model: measured curves" in text.stdout
    for title in ("per op and size bin:", "per module:", "per step:"):
        assert title in text.stdout
    assert "measured" in text.stdout and "predicted" in text.stdout and "error" in text.stdout
    data = json.loads(cli("estimate", str(held_out), "--cluster", str(cluster_file), "--json").stdout)
    rows = data["tables"]["op,bin"]
    assert rows and all({"measured_s", "predicted_s", "error", "size_bin_label"} <= set(r) for r in rows)
    total = data["total"]
    assert sum(r["measured_s"] for r in rows) == pytest.approx(total["measured_s"])
    assert sum(r["predicted_s"] for r in rows) == pytest.approx(total["predicted_s"])
    assert total["calls"] == 24 and data["ranks"] == 2
    # each row's error as printed
    for r in rows:
        assert f"{r['error'] * 100:+.1f}%" in text.stdout


@pytest.mark.proc
def test_gpu_check_says_in_one_line_that_there_is_no_gpu_and_exits_0():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench/gpu_check.py is run by hand on it (its output goes in the notes)")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "no CUDA GPU" in proc.stdout
