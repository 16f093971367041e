"""Predicted communication time on a target cluster (commdebug.estimate): the model, cluster
files, nccl-tests calibration, the summary's predicted columns and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from commdebug import ops
from commdebug.errors import CommDebugError
from commdebug.estimate import PRESETS, Cluster, Link, load_cluster, predict, predict_events
from commdebug.estimate.calibrate import calibrate, parse_nccl_tests
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.units import format_duration

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
             "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    for r in range(ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {f'node{r // per_node}':>10} device {r % per_node:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3")
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
    assert "predicted on cluster h100-ib400" in text and "pred time" in text and "pred busbw GB/s" in text
    expected = sum(predict(comm.trace, H100))
    assert f"{format_duration(expected)} of communication" in text
    from commdebug.analysis.summary import summarize

    rows = summarize(comm.trace, "op").to_dict()["rows"]
    assert sum(r["predicted_s"] for r in rows) == pytest.approx(expected) and all(r["time_s"] is None for r in rows)
    assert summarize(comm.trace, "op").rows[0].predicted_s is not None  # the trace's own cluster
    saved = comm.trace.metadata.pop("cluster")
    try:
        assert all(r.predicted_s is None for r in summarize(comm.trace, "op").rows)
        assert "pred time" not in comm.generate_summary_table(by="op")
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


@pytest.mark.proc
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
    assert text.returncode == 0 and "predicted time" in text.stdout and "per step:" in text.stdout
    assert cli("estimate", str(path)).returncode == 0  # the dump's own cluster
    bad = cli("estimate", str(path), "--cluster", "nowhere.json")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nowhere.json" in bad.stderr  # a usage error
    listed = cli("estimate", "--list")
    assert "h100-ib400" in listed.stdout and "nccl-tests#212" in listed.stdout and "370" in listed.stdout


@pytest.mark.proc
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
    assert bad.returncode == 2 and "missing.txt: no such file" in bad.stderr and bad.stderr.count("\n") == 1


# ---- predictions wherever times are: the table, the Chrome trace, the page -----------------

PRED = re.compile(r", predicted (\d+(?:\.\d+)? [mun]?s) on (\S+)( \((\d+) of (\d+) calls\))?$")
SECTIONS = {"FORWARD PASS": "forward", "BACKWARD PASS": "backward", "ACTIVATION CHECKPOINTING": "checkpoint",
            "OPTIMIZER STEP": "optimizer"}


def predicted_lines(table: str, trace) -> list[tuple[str, str, str, str, str, str]]:
    """(fqn, phase, key, group label, shown ms, cluster) of every collective line with a prediction."""
    out, fqn, phase = [], None, None
    for line in table.splitlines():
        text = line.strip()
        if text in trace.modules:
            fqn = text
        elif text in SECTIONS:
            phase = SECTIONS[text]
        elif text.startswith("*") and not text.startswith("**") and " on " in text:
            m = PRED.search(text)
            if m:
                key = text[1:text.index(":")]
                label = text[:m.start()].rsplit(" on ", 1)[1]
                out.append((fqn, phase, key, label, m.group(1), m.group(2)))
    return out


def under(module: str, fqn: str) -> bool:
    return fqn == "Global" or module == fqn or module.startswith(fqn + ".")


def test_table_lines_at_noise_1_show_the_sum_of_their_calls_predictions(plan):
    comm, _ = plan
    trace = comm.trace
    seconds = predict_events(trace.events, H100, rank=0).seconds
    for level in (1, 2, 3):
        table = comm.generate_comm_debug_tracing_table(level, color=False)
        lines = predicted_lines(table, trace)
        # every collective line is predicted: as many as the noise-0 table has collective lines
        plain = comm.generate_comm_debug_tracing_table(0, color=False)
        assert len(lines) == sum(1 for t in plain.splitlines() if t.strip().startswith("*")) > 10
        for fqn, phase, key, label, shown, cluster in lines:
            expected = sum(s for e, s in zip(trace.events, seconds, strict=True)
                           if e.phase == phase and e.key == key and e.group.label == label and under(e.module, fqn))
            assert cluster == "h100-ib400" and shown == format_duration(expected), (fqn, phase, key)
    # the log file is the same table
    path = Path(plan[1]).with_suffix(".txt")
    comm.log_comm_debug_tracing_table_to_file(str(path), noise_level=1)
    assert path.read_text() == comm.generate_comm_debug_tracing_table(1, color=False)


def test_table_without_a_cluster_or_at_noise_0_is_unchanged(plan):
    from commdebug.render.table import render_table

    comm, _ = plan
    with_cluster = [comm.generate_comm_debug_tracing_table(n, color=False) for n in range(4)]
    saved = comm.trace.metadata.pop("cluster")
    try:
        without = [comm.generate_comm_debug_tracing_table(n, color=False) for n in range(4)]
    finally:
        comm.trace.metadata["cluster"] = saved
    assert with_cluster[0] == without[0] and "predicted" not in without[0]
    assert all("predicted" not in t for t in without)
    for n in (1, 2, 3):  # predictions only add a suffix to collective lines
        assert ", predicted " in with_cluster[n]
        assert "\n".join(PRED.sub("", t) for t in with_cluster[n].split("\n")) == without[n]
    # level 0 ignores predictions even when passed
    from commdebug.analysis.predicted import trace_predictions

    assert render_table(comm.trace, 0, color=False, predicted=trace_predictions(comm.trace)) == without[0]


def test_table_says_when_only_some_calls_are_predicted(world, tp_transformer_module):
    from commdebug import CommDebugMode

    model, tokens = tp_transformer_module
    comm = CommDebugMode(cluster="a100-ib200", max_events=5)  # the older calls are dropped
    with comm:
        model(tokens).sum().backward()
    table = comm.generate_comm_debug_tracing_table(1, color=False)
    global_bw = next(t for t in table.splitlines()[:8] if "all_reduce" in t and "on a100-ib200 (" in t)
    m = PRED.search(global_bw)
    assert m and int(m.group(4)) < int(m.group(5)) and global_bw.strip().startswith(f"*c10d_functional.all_reduce: {m.group(5)} ")


def test_no_prediction_is_made_while_recording(world, tp_transformer_module, monkeypatch):
    import commdebug.estimate.alpha_beta as alpha_beta
    from commdebug import CommDebugMode

    calls = []
    real = alpha_beta.predict_events
    monkeypatch.setattr(alpha_beta, "predict_events", lambda *a, **k: calls.append(1) or real(*a, **k))
    model, tokens = tp_transformer_module
    comm = CommDebugMode(cluster="h100-ib400")
    with comm:
        model(tokens).sum().backward()
    assert calls == []
    assert "predicted" in comm.generate_comm_debug_tracing_table(1, color=False) and calls == [1]


@pytest.mark.proc
def test_cli_table_with_cluster_and_bad_clusters(plan, tmp_path):
    comm, path = plan
    own = cli("table", str(path), "--noise-level", "1")
    assert own.returncode == 0 and "s on h100-ib400" in own.stdout
    other = cli("table", str(path), "--noise-level", "1", "--cluster", "a100-ib200")
    assert other.returncode == 0 and "s on a100-ib200" in other.stdout and "h100-ib400" not in other.stdout
    expected = predicted_lines(comm.generate_comm_debug_tracing_table(1, color=False), comm.trace)
    assert [line[:4] for line in predicted_lines(other.stdout, comm.trace)] == [line[:4] for line in expected]
    quiet = cli("table", str(path), "--cluster", "a100-ib200")  # level 0: the reference's layout
    assert quiet.returncode == 0 and "predicted" not in quiet.stdout and "--noise-level 1" in quiet.stderr
    for verb in (["table", str(path), "--noise-level", "1"], ["trace", str(path), "-o", str(tmp_path / "t.json")],
                 ["view", str(path), "-o", str(tmp_path / "v.html")], ["summary", str(path)]):
        bad = cli(*verb, "--cluster", "h100-typo")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, (verb, bad.stderr)
        assert bad.stderr.startswith("commdebug: error: h100-typo: neither a preset") and "Traceback" not in bad.stderr
    broken = tmp_path / "c.json"
    broken.write_text('{"gpus_per_node": 8}')
    bad = cli("table", str(path), "--noise-level", "1", "--cluster", str(broken))
    assert bad.returncode == 2 and "missing key 'intra_node'" in bad.stderr and bad.stderr.count("\n") == 1
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "v.html").exists()


def test_predict_defaults_to_the_traces_own_cluster(plan):
    comm, _ = plan
    assert predict(comm.trace) == predict(comm.trace, "h100-ib400") == predict_events(comm.trace.events, H100).seconds
    saved = comm.trace.metadata.pop("cluster")
    try:
        with pytest.raises(CommDebugError, match="no cluster to predict on"):
            predict(comm.trace)
    finally:
        comm.trace.metadata["cluster"] = saved


@pytest.mark.proc
def test_chrome_trace_has_a_predicted_track_per_rank(plan, tmp_path):
    from chrome_trace_rules import validate_chrome_trace

    comm, path = plan
    out = tmp_path / "t.json"
    proc = cli("trace", str(path), "-o", str(out))
    assert proc.returncode == 0 and "predicted spans" in proc.stdout, proc.stderr
    events = validate_chrome_trace(json.loads(out.read_text()))
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    pred = [e for e in events if e.get("cat") == "predicted"]
    tids = {e["tid"] for e in pred}
    assert len(tids) == 1 and names[tids.pop()] == "predicted on h100-ib400"
    assert all(e["ph"] == "X" and e["args"]["predicted"] is True and e["args"]["cluster"] == "h100-ib400" for e in pred)
    # nothing predicted on the measured tracks, nothing measured on the predicted one
    assert not any(e.get("args", {}).get("predicted") for e in events if e.get("cat") != "predicted")
    assert not any("busbw_gbps" in e["args"] for e in pred)
    # back to back in call order, each as long as predicted
    seconds = predict_events(comm.trace.events, H100).seconds
    assert [e["args"]["op"] for e in pred] == [e.op for e in comm.trace.events]
    assert [e["dur"] for e in pred] == pytest.approx([s * 1e6 for s in seconds])
    assert pred[0]["ts"] == 0 and all(b["ts"] == pytest.approx(a["ts"] + a["dur"]) for a, b in pairwise(pred))
    # --cluster overrides the dump's own
    other = cli("trace", str(path), "-o", str(out), "--cluster", "a100-ib200")
    assert other.returncode == 0
    events = validate_chrome_trace(json.loads(out.read_text()))
    assert {e["args"]["cluster"] for e in events if e.get("cat") == "predicted"} == {"a100-ib200"}


def test_chrome_trace_without_a_cluster_has_no_predicted_track(plan, tmp_path):
    from commdebug import iter_ranks, write_output
    from commdebug.render.chrome_trace import ChromeTrace

    def write_chrome_trace(path_in, path_out, cluster=None):
        chrome = ChromeTrace(cluster)
        write_output(path_out, chrome.render(iter_ranks(path_in)))
        return chrome.counts

    _, path = plan
    data = json.loads(path.read_text())
    del data["commdebug"]["metadata"]["cluster"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    counts = write_chrome_trace(bare, tmp_path / "t.json")
    text = (tmp_path / "t.json").read_text()
    assert counts["predicted"] == 0 and "predicted" not in text
    with_cluster = write_chrome_trace(bare, tmp_path / "t2.json", "h100-ib400")
    assert with_cluster["predicted"] == len(data["commdebug"]["events"]["columns"]["index"])
    both = json.loads((tmp_path / "t2.json").read_text())["traceEvents"]
    (tid,) = {e["tid"] for e in both if e.get("cat") == "predicted"}
    measured = [e for e in both if e["tid"] != tid]
    assert measured == json.loads(text)["traceEvents"]  # the measured part is byte-for-byte the same


def test_page_embeds_predictions_only_with_a_cluster(plan):
    import visualizer

    comm, path = plan
    data = json.loads(path.read_text())
    pred = visualizer.predictions_data(data)
    seconds = predict_events(comm.trace.events, H100).seconds
    assert pred["cluster"] == "h100-ib400" and pred["events"] == pytest.approx(seconds, rel=1e-5)
    assert pred["modules"]["Global"]["forward"] + pred["modules"]["Global"]["backward"] == pytest.approx(sum(seconds), rel=1e-5)
    assert 'id="predicted"' in visualizer.render_html(data)
    assert visualizer.predictions_data(data, "a100-ib200")["cluster"] == "a100-ib200"
    del data["commdebug"]["metadata"]["cluster"]
    assert visualizer.predictions_data(data) is None and 'id="predicted"' not in visualizer.render_html(data)
