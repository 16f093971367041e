"""Prometheus metrics of a recording session (docs/metrics.md): names, labels, units and the
values they take, scraped over HTTP from a session recording a fake-PG loop here. The real
multi-process case is in tests/test_watch.py."""

from __future__ import annotations

import re
import urllib.request

import torch
import torch.distributed as dist

from commdebug.launch.metrics import metrics_port
from commdebug.launch.session import RecordingSession

from test_watch import free_port, poll


def test_counters_histograms_and_step_over_http(tmp_path, world):
    port = free_port()
    session = RecordingSession(tmp_path / "traces", metrics_port=port, timing="sync", html=False).start()
    try:
        param = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([param], lr=0.1)
        for _ in range(3):
            for _ in range(4):
                dist.all_reduce(torch.ones(256))
            dist.broadcast(torch.ones(8), src=0)
            param.grad = torch.zeros(4)
            opt.step()
        def scrape():
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            return text if "commdebug_step 3.0" in text else None
        import time
        text = poll(scrape, time.monotonic() + 30, 0.2)
    finally:
        session.finish()
    assert text
    label = 'group="default_pg[8]",op="all_reduce",phase="forward"'
    assert f"commdebug_collectives_total{{{label}}} 12.0" in text
    assert f"commdebug_bytes_total{{{label}}} 12288.0" in text
    assert re.search(r'^commdebug_collective_latency_seconds_count\{group="default_pg\[8\]",op="broadcast"\} 3\.0$', text, re.M)
    assert re.search(r'^commdebug_collective_busbw_gbps_bucket\{group="default_pg\[8\]",le="\+Inf",op="all_reduce"\} 12\.0$', text, re.M)
    assert 'commdebug_rank_info{hostname=' in text
    assert "module" not in re.sub(r"^#.*$", "", text, flags=re.M)  # no per-module label: bounded cardinality


def test_each_local_rank_gets_its_own_port():
    assert metrics_port(9400, {"LOCAL_RANK": "3"}) == 9403 and metrics_port(9400, {}) == 9400
