"""A job over two hosts, each node writing its own folder (docs/ranks.md, "A job over several
hosts"): two torchrun agents on this machine, each in its own UTS namespace (`unshare -u`, host
names node0 and node1), `--nnodes 2 --nproc-per-node 2` with static rendezvous on loopback,
running a DDP loop on gloo whose rank 3 (on node1) arrives late at step 3, under `commdebug run
--out run/node<k> --timing --profile-steps 1` (DDP's buckets return before they finish, and DDP
waits for them in C++: bare `--timing` times each from the call to its Work's completion, which
gloo's future reports, so their waits name the late rank). One job for the module (about 30 s); every verb
reads its folders in this process, writing nothing into them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commdebug.capture import light
from commdebug.cli import main

from test_watch import free_port

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "ddp_job.py"
BACKWARD_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "loss.backward()" in line)
DEADLINE_S = 180
# without the C++ extension a Work has no completion stamp, and only waiting times DDP's buckets
TIMING = ["--timing"] if light._native is not None else ["--timing", "sync"]


def _namespaces() -> str | None:
    """Why this machine cannot give a process a host name of its own, or None when it can."""
    if shutil.which("unshare") is None:
        return "no `unshare` (util-linux)"
    try:
        done = subprocess.run(["unshare", "-u", "sh", "-c", "hostname node-test"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else done.stderr.strip()


# Not skipped where namespaces are refused: a green run must mean two hosts were tested.
pytestmark = [pytest.mark.proc, pytest.mark.timeout(2 * DEADLINE_S)]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    refused = _namespaces()
    if refused:
        pytest.fail(f"two host names on one machine need `unshare -u` (root, or user namespaces): {refused}")
    root = tmp_path_factory.mktemp("nodes") / "run"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "STEPS": "6", "LATE_RANK": "3",
           "LATE_STEP": "3", "LATE_S": "0.5"}
    agents = []
    for node in (0, 1):
        cmd = ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', f"node{node}",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "commdebug", "run", "--out", str(root / f"node{node}"), *TIMING, "--profile-steps", "1", "--", str(JOB)]
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for agent in agents:
            outputs.append(agent.communicate(timeout=DEADLINE_S)[0])
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert sorted(p.name for p in root.glob("node*/rank*.json")) == ["rank0.json", "rank1.json", "rank2.json", "rank3.json"]
    return root


def cli(capsys, *argv: object) -> tuple[int, str]:
    status = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert not out.err or status != 0, out.err
    return status, out.out


def test_every_verb_on_the_parent_folder_sees_four_ranks_and_both_hosts(run, capsys, tmp_path):
    hosts = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    status, out = cli(capsys, "check", run)
    assert status == 0 and out.startswith("consistent: 4 ranks, 1 group"), out
    assert cli(capsys, "check", run / "node0", run / "node1")[1] == out
    status, out = cli(capsys, "report", run, "--json")
    report = json.loads(out)
    assert {r["rank"]: r["host"] for r in report["ranks"]} == hosts and all(r["straggler_s"] is not None for r in report["ranks"])
    # the planted late rank, on node1, named with its line
    late = [e for e in report["late_ranks"] if e["step"] == 3]
    assert late and late[0]["rank"] == 3 and late[0]["source"].endswith(f"ddp_job.py:{BACKWARD_LINE}"), report["late_ranks"]
    status, out = cli(capsys, "summary", run)
    assert out.startswith("commdebug summary by op: ranks 0-3 of 4 on node0, node1, 6 steps"), out
    status, out = cli(capsys, "trace", run, "-o", tmp_path / "trace.json")
    names = {e["pid"]: e["args"]["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["name"] == "process_name"}
    assert names == {r: f"rank {r} ({h})" for r, h in hosts.items()}
    status, out = cli(capsys, "view", run, "-o", tmp_path / "index.html")
    page = (tmp_path / "index.html").read_text()
    assert status == 0 and '"hostname":"node0"' in page and '"hostname":"node1"' in page
    status, out = cli(capsys, "overlap", run, "--json")
    assert status == 0 and sorted(r["rank"] for r in json.loads(out)["ranks"]) == [0, 1, 2, 3]
    status, out = cli(capsys, "watch", run, "--once", "--json")
    frame = json.loads(out)
    assert status == 0 and {r["rank"]: r["hostname"] for r in frame["ranks"]} == hosts and frame["over"], out
    status, out = cli(capsys, "estimate", run, "--cluster", "h100-ib400", "--json")
    assert status == 0 and json.loads(out)["ranks"] == 4
    status, out = cli(capsys, "diff", run, run)
    assert status == 0, out


@pytest.mark.parametrize("node,present,absent", [(0, [0, 1], [2, 3]), (1, [2, 3], [0, 1])])
def test_each_nodes_folder_alone_is_consistent_among_its_ranks_and_names_the_others(run, capsys, node, present, absent):
    folder, other = run / f"node{node}", run / f"node{1 - node}"
    status, out = cli(capsys, "check", folder)
    assert status == 0 and out.startswith(f"consistent among ranks {present[0]}-{present[1]} of 4: 2 ranks"), out
    assert "INCONSISTENT" not in out and "no_dump" not in out
    assert (f"note: ranks {absent[0]}-{absent[1]} of 4 are not in {folder} (no dump, stream or fault record of theirs): "
            f"they may be in {other} beside it; read the parent folder for the whole job") in out.splitlines()
    verdict = json.loads(cli(capsys, "check", folder, "--json")[1])
    assert (verdict["ranks_present"], verdict["ranks_absent"]) == (present, absent)
    report = json.loads(cli(capsys, "report", folder, "--json")[1])
    assert [r["straggler_s"] for r in report["ranks"]] == [None, None] and report["late_ranks"] == []
    frame = json.loads(cli(capsys, "watch", folder, "--once", "--json")[1])
    assert (frame["missing"], frame["elsewhere"], frame["over"], frame["healthy"]) == ([], absent, True, True)


def test_the_traces_arrows_run_forward_and_each_hosts_offset_is_kept(run, capsys, tmp_path):
    status, out = cli(capsys, "trace", run, "-o", tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    clocks = trace["metadata"]["commdebug_clocks"]
    assert (clocks["method"], clocks["per"]) == ("calls", "host")
    reference, node1 = clocks["clocks"]
    assert (reference["host"], reference["ranks"], node1["host"], node1["ranks"]) == ("node0", [0, 1], "node1", [2, 3])
    assert node1["low_s"] <= node1["offset_s"] <= node1["high_s"] and node1["calls"] > 0
    sign = "+" if node1["offset_s"] >= 0 else "-"
    assert out.splitlines()[2].startswith(f"  host node1 (ranks 2-3): {sign}")  # printed as kept
    host = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    chains: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "t", "f"):
            chains.setdefault(e["id"], []).append(e)
    assert chains
    steps = [(b["ts"] - a["ts"], host[a["pid"]] == host[b["pid"]]) for points in chains.values() for a, b in zip(points, points[1:], strict=False)]
    assert all(dt >= 0 for dt, same in steps if same), steps  # one host, one clock: never back in time
    bound_us = node1["uncertainty_s"] * 1e6 + 0.002  # across hosts: at most the offset's uncertainty (and the file's ns rounding)
    assert all(dt >= -bound_us for dt, same in steps if not same), (bound_us, steps)
    # each blocking call: its last member started before its first member ended, on the trace's clock
    spans: dict[tuple, list[tuple[float, float]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "collective" and e["name"] in ("all_reduce", "all_gather"):
            spans.setdefault((e["args"]["group"], e["args"]["seq"]), []).append((e["ts"], e["ts"] + e["dur"]))
    assert all(max(s for s, _ in v) <= min(t for _, t in v) + bound_us for v in spans.values())
