"""Prometheus metrics of a recording session (docs/metrics.md): names, labels, units and the
values they take, scraped over HTTP from a session recording a fake-PG loop here; the final
values a rank leaves at exit (rank<R>.prom) and what a push to a Pushgateway that does not
answer costs. The real multi-process cases (a real Prometheus and Pushgateway) are in
tests/test_prometheus.py; the hang signal on a real job in tests/test_watch.py."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from prometheus_client.parser import text_string_to_metric_families

import commdebug
from commdebug.analysis.summary import summarize
from commdebug.capture.config import ConfigError, check_option
from commdebug.formats.folders import job_files
from commdebug.launch.metrics import Metrics, metrics_port
from commdebug.launch.session import RecordingSession

from test_watch import free_port, poll


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition text: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def _loop(steps: int = 3) -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([param], lr=0.1)
    for _ in range(steps):
        for _ in range(4):
            dist.all_reduce(torch.ones(256))
        dist.broadcast(torch.ones(8), src=0)
        param.grad = torch.zeros(4)
        opt.step()


def test_counters_histograms_and_step_over_http(tmp_path, world):
    port = free_port()
    session = RecordingSession(tmp_path / "traces", metrics_port=port, timing="sync", html=False).start()
    try:
        started = time.time()
        _loop()

        def scrape():
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            return text if any(name == "commdebug_step" and v == 3.0 for (name, _), v in samples(text).items()) else None
        text = poll(scrape, time.monotonic() + 30, 0.2)
    finally:
        session.finish()
    assert text
    got = samples(text)
    who = (("host", commdebug.load(tmp_path / "traces" / "rank0.json").metadata["hostname"]), ("rank", "0"))
    reduce = tuple(sorted((*who, ("group", "default_pg[8]"), ("op", "all_reduce"), ("phase", "forward"))))
    assert got[("commdebug_collectives_total", reduce)] == 12.0
    assert got[("commdebug_bytes_total", reduce)] == 12288.0
    assert got[("commdebug_collective_latency_seconds_count", tuple(sorted((*who, ("group", "default_pg[8]"), ("op", "broadcast")))))] == 3.0
    # bus bandwidth in bytes per second, the base unit: the +Inf bucket holds every timed all_reduce
    inf = tuple(sorted((*who, ("group", "default_pg[8]"), ("le", "+Inf"), ("op", "all_reduce"))))
    assert got[("commdebug_collective_busbw_bytes_per_second_bucket", inf)] == 12.0
    assert not any(name.startswith("commdebug_collective_busbw_gbps") for name, _ in got)
    # every series of ours says whose it is, so no query needs a join on commdebug_rank_info
    ours = [labels for name, labels in got if name.startswith("commdebug_") and not name.endswith("_created")]
    assert ours and all(dict(labels).get("rank") == "0" and dict(labels).get("host") == who[0][1] for labels in ours)
    progress = got[("commdebug_last_progress_timestamp_seconds", who)]
    assert started <= progress <= time.time()
    assert "module" not in {k for labels in ours for k, _ in labels}  # no per-module label: bounded cardinality


def test_the_final_values_beside_the_dump_equal_the_dumps_counts(tmp_path, world):
    """A scrape every few seconds misses what a rank did after its last one: at exit the rank
    writes rank<R>.prom, after the stream's last flush, so it holds every call of the dump."""
    session = RecordingSession(tmp_path / "traces", metrics_port=free_port(), html=False).start()
    try:
        _loop(5)
        dist.all_reduce(torch.ones(4))  # the last call, after the last step boundary
    finally:
        session.finish()
    prom = tmp_path / "traces" / "rank0.prom"
    got = samples(prom.read_text())
    counted = {dict(labels)["op"]: v for (name, labels), v in got.items() if name == "commdebug_collectives_total"}
    summary = summarize(commdebug.load(tmp_path / "traces" / "rank0.json"), "op")
    assert counted == {row.key["op"]: float(row.calls) for row in summary.rows} == {"all_reduce": 21.0, "broadcast": 5.0}
    # the folder's verbs read past it: it is no rank's dump
    assert [f.name for f in job_files(tmp_path / "traces")] == ["rank0.json"]


def test_a_pushgateway_that_does_not_answer_costs_a_bounded_wait_and_a_warning(tmp_path, world, caplog):
    metrics = Metrics(None)  # --metrics-push alone: nothing served
    metrics.observe(1, {"rank": 3, "hostname": "h", "world_size": 8, "run_id": "r"}, [], [])
    silent = socket.socket()  # listens, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        with caplog.at_level(logging.WARNING, logger="commdebug"):
            written = metrics.finish(tmp_path, push=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
    finally:
        silent.close()
    assert written == (tmp_path / "rank3.prom").resolve() and 'rank="3"' in written.read_text()
    assert "did not answer" in caplog.text or "could not push rank 3's final metrics" in caplog.text, caplog.text


@pytest.mark.parametrize("value", ["ftp://gateway", "gateway:port"])
def test_a_bad_push_url_is_refused(value):
    with pytest.raises(ConfigError, match="metrics_push must be an http"):
        check_option("metrics_push", value)
    assert check_option("metrics_push", "gateway:9091") == "http://gateway:9091"


def test_each_local_rank_gets_its_own_port():
    assert metrics_port(9400, {"LOCAL_RANK": "3"}) == 9403 and metrics_port(9400, {}) == 9400


@pytest.mark.proc
def test_a_failed_push_never_changes_the_jobs_exit_status(tmp_path):
    """`commdebug run --metrics-push` to a gateway that is not there: the program's own exit
    status, one warning, and the final values still beside the dump."""
    closed = free_port()  # nothing listens there
    program = tmp_path / "job.py"
    program.write_text("import sys, torch, torch.distributed as dist\n"
                       f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)\n"
                       "dist.all_reduce(torch.ones(4))\n"
                       "dist.destroy_process_group()\n"
                       "sys.exit(3)\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "commdebug", "run", "--out", "traces", "--metrics-push", f"127.0.0.1:{closed}",
                           "--", str(program)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert f"could not push rank 0's final metrics to http://127.0.0.1:{closed}" in proc.stderr
    counted = {dict(labels)["op"]: v for (name, labels), v in samples((tmp_path / "traces" / "rank0.prom").read_text()).items()
               if name == "commdebug_collectives_total"}
    assert counted == {"all_reduce": 1.0}
