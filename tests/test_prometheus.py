"""Prometheus as users run it (docs/metrics.md), against Debian's own Prometheus, Pushgateway and
node_exporter, each started here on a free loopback port with its storage in a temporary
folder, and stopped at the end: a real Prometheus scrapes a 2-rank gloo job under `commdebug run
--metrics-port --metrics-push`, and holds its final counts with a `rank` label; the `.prom`
files and the Pushgateway hold the same; node_exporter's textfile collector reads the files;
the alert rules of docs/metrics.md load into the Prometheus and fire on their cases
(`promtool test rules`). One job for the module (about 20 s)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import commdebug
from commdebug.analysis.summary import summarize

from test_watch import free_port, get, poll

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "ddp_job.py"
BINARIES = {"prometheus": "prometheus", "pushgateway": "prometheus-pushgateway", "node_exporter": "prometheus-node-exporter",
            "promtool": "promtool"}
DEADLINE_S = 120

# Not skipped where the binaries are missing: a green run must mean a real Prometheus read us.
pytestmark = [pytest.mark.proc, pytest.mark.timeout(4 * DEADLINE_S)]


@pytest.fixture(scope="module", autouse=True)
def binaries() -> None:
    missing = [b for b in BINARIES.values() if shutil.which(b) is None]
    if missing:
        pytest.fail(f"no {', '.join(missing)}: apt-get install prometheus prometheus-pushgateway prometheus-node-exporter "
                    "(bash scripts/dev.sh test installs them)")


def rules_from_docs() -> str:
    """The alert rules block of docs/metrics.md, as the page gives it."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("groups:")]
    return block


class Service:
    """A server started here; stopped (and reaped) by :meth:`stop`, whatever happened."""

    def __init__(self, name: str, args: list[str], ready: str, log: Path) -> None:
        self.name, self.ready = name, ready
        self.log = log.open("w")
        self.proc = subprocess.Popen([shutil.which(BINARIES[name]) or name, *args], stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        up = poll(lambda: self.proc.poll() is not None or get(self.ready) is not None, time.monotonic() + DEADLINE_S, 0.2)
        assert up and self.proc.poll() is None, f"{self.name} did not start: {Path(self.log.name).read_text()[-2000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Pushgateway, then Prometheus scraping the job's two rank ports and the gateway, with the
    docs' alert rules loaded."""
    root = tmp_path_factory.mktemp("prometheus")
    ranks, gateway, web = free_port(2), free_port(), free_port()
    (root / "rules.yml").write_text(rules_from_docs())
    (root / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(root / "rules.yml")],
        "scrape_configs": [
            {"job_name": "train", "static_configs": [{"targets": [f"127.0.0.1:{ranks}", f"127.0.0.1:{ranks + 1}"]}]},
            {"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{gateway}"]}]},
        ]}))
    services = []
    try:
        # Debian's gateway keeps what it was pushed in /var/lib/prometheus by default: here, in this test's folder
        services.append(Service("pushgateway", [f"--web.listen-address=127.0.0.1:{gateway}",
                                                f"--persistence.file={root / 'pushgateway.data'}"],
                                f"http://127.0.0.1:{gateway}/-/ready", root / "pushgateway.log"))
        services.append(Service("prometheus", [f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
                                               f"--web.listen-address=127.0.0.1:{web}"], f"http://127.0.0.1:{web}/-/ready",
                                root / "prometheus.log"))
        for s in services:
            s.wait_ready()
        yield {"root": root, "ranks": ranks, "gateway": gateway, "web": web}
    finally:
        for s in services:
            s.stop()


@pytest.fixture(scope="module")
def job(stack):
    """2 gloo ranks, 20 steps of DDP (about 4 s of metrics), recorded with --timing, serving
    metrics and pushing their final values. Its own job: it must run while the Prometheus
    stack above scrapes it, which no other module's job does."""
    cwd = stack["root"] / "job"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STEPS": "20", "STEP_S": "0.2", "LATE_RANK": "-1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "commdebug", "run",
           "--out", "traces", "--timing", "--metrics-port", str(stack["ranks"]), "--metrics-push",
           f"127.0.0.1:{stack['gateway']}", "--", str(JOB)]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Pushgateway" not in proc.stderr and "could not" not in proc.stderr, proc.stderr[-2000:]
    return cwd / "traces"


def summary_counts(traces: Path) -> dict[tuple[str, str], float]:
    """(rank, op) -> calls, as `commdebug summary` counts them in each rank's dump."""
    out = {}
    for rank in (0, 1):
        for row in summarize(commdebug.load(traces / f"rank{rank}.json"), "op").rows:
            out[(str(rank), row.key["op"])] = float(row.calls)
    return out


def counters(text: str, name: str = "commdebug_collectives_total") -> dict[tuple[str, str], float]:
    """(rank, op) -> value of a counter in exposition text, summed over groups and phases."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                key = (s.labels["rank"], s.labels["op"])
                out[key] = out.get(key, 0.0) + s.value
    return out


def query(stack, promql: str) -> list[dict]:
    reply = get(f"http://127.0.0.1:{stack['web']}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    return json.loads(reply)["data"]["result"] if reply else []


def test_prometheus_holds_the_final_counts_with_a_rank_label(stack, job):
    want = summary_counts(job)
    assert want[("0", "all_reduce")] == want[("1", "all_reduce")] == 20.0

    seen: list[dict] = [{}]

    def final():
        rows = query(stack, 'max by (rank, op) (commdebug_collectives_total{job="commdebug"})')
        seen[0] = got = {(r["metric"]["rank"], r["metric"]["op"]): float(r["value"][1]) for r in rows}
        return got if got == want else None

    gateway = f"http://127.0.0.1:{stack['gateway']}/metrics"
    assert poll(final, time.monotonic() + DEADLINE_S, 0.5) == want, (
        f"Prometheus last held {seen[0]}; the gateway holds {counters(get(gateway) or '')}")
    # the live endpoints were scraped during the run too, each series with its rank and host
    live = query(stack, 'max_over_time(commdebug_step{job="train"}[10m])')
    assert {r["metric"]["rank"] for r in live} == {"0", "1"} and all(r["metric"].get("host") for r in live)
    pushed = query(stack, 'commdebug_rank_info{job="commdebug"}')
    assert {(r["metric"]["rank"], r["metric"]["run_id"]) for r in pushed} == {
        (str(rank), commdebug.load(job / f"rank{rank}.json").metadata["run_id"]) for rank in (0, 1)}


def test_the_prom_files_and_the_pushgateway_hold_the_same_counts(stack, job):
    want = summary_counts(job)
    files = {}
    for rank in (0, 1):
        files.update(counters((job / f"rank{rank}.prom").read_text()))
    assert files == want
    assert counters(get(f"http://127.0.0.1:{stack['gateway']}/metrics") or "") == want
    # the last progress of each rank: the end of its last call, in its run's time
    for rank in (0, 1):
        meta = commdebug.load(job / f"rank{rank}.json").metadata
        [progress] = [s.value for f in text_string_to_metric_families((job / f"rank{rank}.prom").read_text()) for s in f.samples
                      if s.name == "commdebug_last_progress_timestamp_seconds"]
        assert meta["start_wall_s"] < progress <= meta["start_wall_s"] + meta["elapsed_s"]


def test_node_exporter_reads_the_prom_files(stack, job, tmp_path):
    port = free_port()
    exporter = Service("node_exporter", ["--collector.disable-defaults", "--collector.textfile",
                                         f"--collector.textfile.directory={job}", f"--web.listen-address=127.0.0.1:{port}"],
                       f"http://127.0.0.1:{port}/metrics", tmp_path / "node_exporter.log")
    try:
        exporter.wait_ready()
        text = get(f"http://127.0.0.1:{port}/metrics") or ""
    finally:
        exporter.stop()
    assert counters(text) == summary_counts(job)
    assert re.search(r"^node_textfile_scrape_error 0$", text, re.M), text[-2000:]


def test_the_docs_alert_rules_load_and_fire_on_their_cases(stack, tmp_path):
    """Loaded by the running Prometheus, and evaluated by promtool on series that play a hang,
    a stall and a straggler; a finished run's pushed values (no endpoint up) fire nothing."""
    def evaluated():  # "unknown" until the first evaluation, "err" if a rule cannot run
        rows = json.loads(get(f"http://127.0.0.1:{stack['web']}/api/v1/rules") or '{"data": {"groups": []}}')["data"]["groups"]
        health = {(r["name"], r["health"]) for g in rows for r in g["rules"]}
        return health if all(h != "unknown" for _, h in health) and health else None

    assert poll(evaluated, time.monotonic() + DEADLINE_S, 0.5) == {
        ("CommdebugHang", "ok"), ("CommdebugStalledRank", "ok"), ("CommdebugStraggler", "ok")}
    (tmp_path / "rules.yml").write_text(rules_from_docs())

    def rank(r: int, job: str = "train", **more: str) -> str:
        labels = {"job": job, "rank": str(r), "host": f"node{r // 2}", **({"instance": f"node{r // 2}:940{r % 2}"} if job == "train" else {}), **more}
        return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    series = [{"series": f'up{{job="train", instance="node{r // 2}:940{r % 2}"}}', "values": "1x30"} for r in range(4)]
    # rank 3 stops at minute 5 (step 5) and finishes nothing after; ranks 0-2 wait in its call from minute 6
    for r in range(4):
        stopped = r == 3
        series += [
            {"series": f"commdebug_step{rank(r)}", "values": "0+1x5 5x25" if stopped else "0+1x5 6x25"},
            {"series": f"commdebug_collectives_in_flight{rank(r)}", "values": "0x30" if stopped else "0x5 1x25"},
            {"series": f"commdebug_last_progress_timestamp_seconds{rank(r)}", "values": "0+60x5 300x25"},
        ]
    # a finished run's final values in the Pushgateway: old progress, a call in flight, far behind: never an alert
    series += [{"series": f"commdebug_last_progress_timestamp_seconds{rank(5, job='commdebug', run_id='old')}", "values": "0x30"},
               {"series": f"commdebug_collectives_in_flight{rank(5, job='commdebug', run_id='old')}", "values": "1x30"},
               {"series": f"commdebug_step{rank(5, job='commdebug', run_id='old')}", "values": "0x30"}]

    def alerts(name: str, ranks: list[int], summary: str) -> list[dict]:
        severity = "ticket" if name == "CommdebugStraggler" else "page"
        return [{"exp_labels": {"severity": severity, "job": "train", "rank": str(r), "host": f"node{r // 2}",
                                "instance": f"node{r // 2}:940{r % 2}"},
                 "exp_annotations": {"summary": summary.format(rank=r, host=f"node{r // 2}")}} for r in ranks]

    waits = "rank {rank} on {host} waits in a collective"
    quiet = "rank {rank} on {host} finished no collective for 10 minutes"
    # a straggler: rank 2 goes on at half the others' pace (2 steps behind from minute 4)
    slow = [{"series": f"commdebug_step{rank(r)}", "values": "0+0.5x30" if r == 2 else "0+1x30"} for r in range(4)]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "alert_rule_test": [
            {"eval_time": "4m", "alertname": "CommdebugHang", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "CommdebugHang", "exp_alerts": alerts("CommdebugHang", [0, 1, 2], waits)},
            {"eval_time": "14m", "alertname": "CommdebugStalledRank", "exp_alerts": []},
            {"eval_time": "17m", "alertname": "CommdebugStalledRank", "exp_alerts": alerts("CommdebugStalledRank", [0, 1, 2, 3], quiet)},
            {"eval_time": "20m", "alertname": "CommdebugStraggler", "exp_alerts": []},  # one step behind: no straggler
        ]},
        {"interval": "1m", "input_series": series[:4] + slow, "alert_rule_test": [
            {"eval_time": "6m", "alertname": "CommdebugStraggler", "exp_alerts": []},  # behind, not yet for 5 minutes
            {"eval_time": "10m", "alertname": "CommdebugStraggler",
             "exp_alerts": alerts("CommdebugStraggler", [2], "rank {rank} on {host} is 5 steps behind the median rank")},
        ]},
    ]}
    (tmp_path / "test.yml").write_text(json.dumps(test))
    proc = subprocess.run([shutil.which("promtool"), "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
