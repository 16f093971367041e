"""Predicted communication time on a target cluster (commdebug.estimate): the model, cluster
files, nccl-tests calibration, the summary's predicted columns and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commdebug import ops
from commdebug.errors import CommDebugError
from commdebug.estimate import PRESETS, Cluster, Link, load_cluster, predict, predict_events
from commdebug.estimate.calibrate import calibrate, parse_nccl_tests
from commdebug.model.trace import CollectiveEvent, GroupInfo

ROOT = Path(__file__).resolve().parents[1]
H100 = PRESETS["h100-ib400"]


def event(op: str = "all_reduce", size: int = 1 << 20, ranks: tuple[int, ...] | None = tuple(range(8)),
          size_n: int | None = None, peer: int | None = None) -> CollectiveEvent:
    n = size_n if size_n is not None else (len(ranks) if ranks else 0)
    spec = ops.spec_for_op(op)
    group = GroupInfo("g" + ",".join(map(str, ranks or ())), "", n, ranks)
    return CollectiveEvent(0, op, op, op, 0, "forward", "Global", group, 0, "float32", (), (), size, size, size,
                           spec.busbw_factor(2 if peer is not None else n), peer=peer)


def seconds(e: CollectiveEvent, cluster: Cluster = H100, **kw) -> float:
    (s,) = predict([e], cluster, **kw)
    return s


def test_time_is_latency_plus_bytes_over_busbw_with_the_events_own_factor():
    e = event("all_reduce", 1 << 30)
    expected = 10.8e-6 + (1 << 30) * (2 * 7 / 8) / 370e9
    assert seconds(e) == pytest.approx(expected)
    # predicted busbw = S x factor / (t - latency) is the cluster's figure
    assert (1 << 30) * e.busbw_factor / (seconds(e) - 10.8e-6) / 1e9 == pytest.approx(370.0)


def test_monotone_in_bytes_group_size_and_link_speed():
    sizes = [seconds(event(size=s)) for s in (0, 1 << 10, 1 << 20, 1 << 30)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    groups = [seconds(event(ranks=tuple(range(n)))) for n in (2, 4, 8)]
    assert groups == sorted(groups) and len(set(groups)) == 3
    slow = Cluster("slow", 8, Link(100.0, 10.8), Link(10.0, 23.3))
    assert seconds(event(), slow) > seconds(event())
    assert seconds(event(ranks=tuple(range(16))), slow) > seconds(event(ranks=tuple(range(16))))


def test_intra_node_group_uses_nvlink_and_spanning_group_the_network():
    inside = seconds(event(ranks=tuple(range(8, 16)), size=0))  # node 1, 8 ranks: intra latency
    assert inside == pytest.approx(10.8e-6)
    across = event(ranks=(0, 8), size=1 << 30)  # one rank per node: one NIC, 48 GB/s
    assert seconds(across) == pytest.approx(23.3e-6 + (1 << 30) * 1.0 / 48e9)
    # 8 ranks on each of 2 nodes: 8 NICs, capped by the intra-node figure
    wide = event(ranks=tuple(range(16)), size=1 << 30)
    assert seconds(wide) == pytest.approx(23.3e-6 + (1 << 30) * wide.busbw_factor / 370e9)
    # ranks per node overridable: with 16 per node the same group stays inside
    assert seconds(wide, ranks_per_node=16) == pytest.approx(10.8e-6 + (1 << 30) * wide.busbw_factor / 370e9)


def test_send_recv_by_whether_the_peer_shares_the_node():
    near = predict_events([event("send", 1 << 20, peer=3)], H100, rank=0).seconds[0]
    far = predict_events([event("send", 1 << 20, peer=9)], H100, rank=0).seconds[0]
    assert near == pytest.approx(10.8e-6 + (1 << 20) / 370e9)
    assert far == pytest.approx(23.3e-6 + (1 << 20) / 48e9)


def test_groups_without_ranks_assume_consecutive_ranks_and_say_so():
    pred = predict_events([event(ranks=None, size_n=16, size=1 << 20)], H100)
    assert pred.seconds[0] == pytest.approx(seconds(event(ranks=tuple(range(16)), size=1 << 20)))
    assert any("consecutive" in n for n in pred.notes)
    unknown = predict_events([event(ranks=None, size_n=0)], H100)
    assert unknown.seconds == [None] and unknown.notes


@pytest.mark.parametrize("content, message", [
    ({"gpus_per_node": 8, "intra_node": {"busbw_gbps": 1, "latency_us": 1}, "network": {"busbw_gbps": 1, "latency_us": 1}, "nics": 8}, "unknown key 'nics'"),
    ({"gpus_per_node": 8, "intra_node": {"busbw_gbps": 1, "latency_us": 1, "bw": 2}, "network": {"busbw_gbps": 1, "latency_us": 1}}, "unknown key 'intra_node.bw'"),
    ({"gpus_per_node": 8, "intra_node": {"busbw_gbps": 0, "latency_us": 1}, "network": {"busbw_gbps": 1, "latency_us": 1}}, "intra_node.busbw_gbps must be a number > 0"),
    ({"gpus_per_node": 8, "intra_node": {"busbw_gbps": 1, "latency_us": 1}, "network": {"busbw_gbps": "fast", "latency_us": 1}}, "network.busbw_gbps must be a number"),
    ({"gpus_per_node": 0, "intra_node": {"busbw_gbps": 1, "latency_us": 1}, "network": {"busbw_gbps": 1, "latency_us": 1}}, "gpus_per_node must be a whole number"),
    ({"gpus_per_node": 8, "intra_node": {"busbw_gbps": 1, "latency_us": 1}}, "missing key 'network'"),
    ("[1, 2", "not valid JSON"),
])
def test_bad_cluster_files_are_one_error_naming_the_file_and_key(tmp_path, content, message):
    path = tmp_path / "c.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(CommDebugError) as info:
        load_cluster(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_cluster_file_round_trips_and_unknown_preset_is_an_error(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(H100.to_dict()))
    assert load_cluster(path) == H100
    with pytest.raises(CommDebugError, match="neither a preset"):
        load_cluster("h100-ib800")


def nccl_tests_output(test: str, ranks: int, per_node: int, lat_us: float, busbw_gbps: float, factor: float) -> str:
    """nccl-tests' text output for a run whose time is exactly lat + S*factor/busbw."""
    lines = [f"# Collective test starting: {test}",
             f"# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    for r in range(ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {'node%d' % (r // per_node):>10} device {r % per_node:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3")
    lines += ["#", "#                                                              out-of-place                       in-place",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    size = 8
    while size <= 1 << 30:
        t = lat_us + size * factor / (busbw_gbps * 1e3)  # us
        algbw = size / t / 1e3
        row = f"{t:8.2f} {algbw:7.2f} {algbw * factor:7.2f}      0"
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {row}  {row}")
        size *= 4
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 100.0", "#"]
    return "\n".join(lines) + "\n"


def test_calibration_recovers_known_latency_and_bandwidth(tmp_path):
    intra = tmp_path / "all_reduce_1node.txt"
    intra.write_text(nccl_tests_output("all_reduce_perf", 8, 8, 12.0, 300.0, 2 * 7 / 8))
    gather = tmp_path / "ag_1node.txt"
    gather.write_text(nccl_tests_output("all_gather_perf", 8, 8, 12.0, 300.0, 7 / 8))
    net = tmp_path / "reduce_scatter_2nodes.txt"  # 2 ranks per node: busbw 2 x 40 per GPU
    net.write_text(nccl_tests_output("reduce_scatter_perf", 4, 2, 30.0, 80.0, 3 / 4))
    assert parse_nccl_tests(net).op == "reduce_scatter" and parse_nccl_tests(net).hosts == 2
    cluster, notes = calibrate([intra, gather, net])  # nodes from the hosts in the Rank lines
    assert cluster.gpus_per_node == 8
    assert cluster.intra_node.busbw_gbps == pytest.approx(300.0, rel=0.01)
    assert cluster.intra_node.latency_us == pytest.approx(12.0, rel=0.05)
    assert cluster.network.busbw_gbps == pytest.approx(40.0, rel=0.01)
    assert cluster.network.latency_us == pytest.approx(30.0, rel=0.05)
    cluster, notes = calibrate([net], gpus_per_node=2, base=H100)
    assert cluster.network.busbw_gbps == pytest.approx(40.0, rel=0.01)
    assert cluster.network.latency_us == pytest.approx(30.0, rel=0.05)
    assert cluster.intra_node == H100.intra_node and any("taken from h100-ib400" in n for n in notes)


def test_calibration_refuses_files_that_are_not_nccl_tests(tmp_path):
    bad = tmp_path / "all_reduce_perf.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(CommDebugError, match="no nccl-tests result rows"):
        parse_nccl_tests(bad)
    anon = tmp_path / "results.txt"
    anon.write_text(nccl_tests_output("x", 8, 8, 1, 1, 1).replace("# Collective test starting: x\n", ""))
    with pytest.raises(CommDebugError, match="cannot tell which collective"):
        parse_nccl_tests(anon)
    with pytest.raises(CommDebugError, match="network link"):
        calibrate([_write(tmp_path, "all_gather_perf.txt", nccl_tests_output("all_gather_perf", 8, 8, 10, 100, 7 / 8))])


def _write(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


# ---- integration: a plan recorded with the fake backend -------------------------------------


@pytest.fixture(scope="module")
def plan(tmp_path_factory, world, tp_transformer_module):
    from commdebug import CommDebugMode

    model, tokens = tp_transformer_module
    comm = CommDebugMode(cluster="h100-ib400")
    with comm:
        model(tokens).sum().backward()
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    comm.generate_json_dump(str(path))
    return comm, path


@pytest.fixture(scope="module")
def tp_transformer_module(world):
    from commdebug.demo import ModelConfig, tensor_parallel_transformer

    model = tensor_parallel_transformer(ModelConfig(n_layers=2), world)
    return model, torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))


def test_summary_with_a_cluster_shows_predicted_columns(plan):
    comm, _ = plan
    text = comm.generate_summary_table(by="op")
    assert "predicted on cluster h100-ib400" in text and "pred ms" in text and "pred busbw GB/s" in text
    expected = sum(predict(comm.trace, H100))
    assert f"{expected * 1e3:.3f} ms of communication" in text
    from commdebug.analysis.summary import summarize

    rows = summarize(comm.trace, "op").to_dict()["rows"]
    assert sum(r["predicted_s"] for r in rows) == pytest.approx(expected) and all(r["time_s"] is None for r in rows)
    assert summarize(comm.trace, "op").rows[0].predicted_s is not None  # the trace's own cluster
    saved = comm.trace.metadata.pop("cluster")
    try:
        assert all(r.predicted_s is None for r in summarize(comm.trace, "op").rows)
        assert "pred ms" not in comm.generate_summary_table(by="op")
    finally:
        comm.trace.metadata["cluster"] = saved


def test_cluster_option_is_checked_when_the_mode_is_made(monkeypatch):
    from commdebug import CommDebugMode
    from commdebug.capture.config import ConfigError

    with pytest.raises(ConfigError, match="cluster: h100-typo: neither a preset"):
        CommDebugMode(cluster="h100-typo")
    monkeypatch.setenv("COMMDEBUG_CLUSTER", "a100-ib200")
    assert CommDebugMode().options.cluster == "a100-ib200"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_cli_estimate_on_a_fake_backend_dump(plan):
    comm, path = plan
    proc = cli("estimate", str(path), "--cluster", "a100-ib200", "--by", "module", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["cluster"] == "a100-ib200" and data["by"] == "module"
    total = sum(predict(comm.trace, PRESETS["a100-ib200"]))
    assert sum(r["predicted_s"] for r in data["rows"]) == pytest.approx(total)
    assert [s["step"] for s in data["steps"]] == [0] and data["steps"][0]["predicted_s"] == pytest.approx(total)
    text = cli("estimate", str(path), "--cluster", "h100-ib400")
    assert text.returncode == 0 and "predicted ms" in text.stdout and "per step:" in text.stdout
    assert cli("estimate", str(path)).returncode == 0  # the dump's own cluster
    bad = cli("estimate", str(path), "--cluster", "nowhere.json")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nowhere.json" in bad.stderr  # a usage error
    listed = cli("estimate", "--list")
    assert "h100-ib400" in listed.stdout and "nccl-tests#212" in listed.stdout and "370" in listed.stdout


def test_cli_calibrate_writes_a_cluster_that_loads(tmp_path):
    files = [_write(tmp_path, "all_reduce_perf.txt", nccl_tests_output("all_reduce_perf", 8, 8, 9.0, 250.0, 2 * 7 / 8)),
             _write(tmp_path, "all_gather_perf_2n.txt", nccl_tests_output("all_gather_perf", 16, 8, 25.0, 320.0, 15 / 16))]
    out = tmp_path / "cluster.json"
    proc = cli("calibrate", *map(str, files), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    cluster = load_cluster(out)
    assert cluster.gpus_per_node == 8 and cluster.network.busbw_gbps == pytest.approx(40.0, rel=0.01)
    assert cluster.intra_node.busbw_gbps == pytest.approx(250.0, rel=0.01)
    bad = cli("calibrate", str(tmp_path / "missing.txt"))
    assert bad.returncode == 1 and "missing.txt: no such file" in bad.stderr and bad.stderr.count("\n") == 1
