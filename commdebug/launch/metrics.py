"""Prometheus metrics of a running rank: ``commdebug run --metrics-port P`` serves ``/metrics``
on port P + LOCAL_RANK, with the ``prometheus_client`` library (names, labels and units in
docs/metrics.md).

Fed by the session's stream (:class:`~commdebug.launch.stream.Streamer` listeners) from its
background thread or at step boundaries, never per collective on the training thread: counters
lag the program by at most a flush interval. Labels are bounded: op, group (its label,
``mesh_tp[4]``), phase; no module label.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from commdebug.model.trace import CollectiveEvent

__all__ = ["Metrics", "metrics_port"]

log = logging.getLogger("commdebug")

# seconds: 10 us to 100 s, as collectives range from a tiny all_reduce to a stuck one
LATENCY_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 100.0)
# GB/s (1e9 bytes/s), as nccl-tests reports bus bandwidth
BUSBW_BUCKETS = (0.01, 0.1, 0.5, 1, 2, 5, 10, 25, 50, 100, 200, 400, 800)
_OBSERVED_MOST = 100_000


def metrics_port(base: int, env: dict[str, str] | None = None) -> int:
    """The port this process serves on: ``base`` + its LOCAL_RANK (0 without one)."""
    local = (os.environ if env is None else env).get("LOCAL_RANK", "0")
    return base + (int(local) if local.isdigit() else 0)


class Metrics:
    """A registry of commdebug's metrics and the HTTP server exposing it (see the module docstring)."""

    def __init__(self, port: int, address: str = "0.0.0.0") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.port = port
        self.registry = CollectorRegistry()
        labels = ("op", "group", "phase")
        self.collectives = Counter("commdebug_collectives", "Collectives issued by this rank", labels, registry=self.registry)
        self.bytes = Counter("commdebug_bytes", "Message bytes (S, as nccl-tests) of the collectives issued", labels,
                             registry=self.registry)
        self.latency = Histogram("commdebug_collective_latency_seconds", "Time of each timed collective (with --timing)",
                                 ("op", "group"), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.busbw = Histogram("commdebug_collective_busbw_gbps", "Bus bandwidth of each timed collective, GB/s (1e9 bytes/s)",
                               ("op", "group"), buckets=BUSBW_BUCKETS, registry=self.registry)
        self.step = Gauge("commdebug_step", "The step this rank is in (from 0)", registry=self.registry)
        self.in_flight = Gauge("commdebug_collectives_in_flight", "Collectives unfinished for 2 s or more", registry=self.registry)
        self.info = Gauge("commdebug_rank_info", "This rank: always 1, its labels say which", ("rank", "world_size", "hostname", "run_id"),
                          registry=self.registry)
        self._observed: set[int] = set()
        self._flagged: set[int] = set()
        self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)

    def observe(self, step: int, metadata: dict[str, Any], new: list[CollectiveEvent], again: list[CollectiveEvent]) -> None:
        """Count the events written for the first time; time those timed (once each)."""
        self.step.set(step)
        for e in new:
            labels = (e.op, e.group.label, e.phase)
            self.collectives.labels(*labels).inc()
            if e.size_bytes is not None:  # a size not known adds nothing
                self.bytes.labels(*labels).inc(e.size_bytes)
        for e in (*new, *again):
            if e.in_flight:
                self._flagged.add(e.index)
            else:
                self._flagged.discard(e.index)
            if e.latency_s is not None and e.index not in self._observed:
                self._observed.add(e.index)
                self.latency.labels(e.op, e.group.label).observe(e.latency_s)
                busbw = e.busbw_gbps
                if busbw is not None:
                    self.busbw.labels(e.op, e.group.label).observe(busbw)
        self.in_flight.set(len(self._flagged))
        if len(self._observed) > _OBSERVED_MOST:  # only recent events can still get their time
            newest = max(self._observed)
            self._observed = {i for i in self._observed if i > newest - _OBSERVED_MOST // 2}
        self.info.clear()  # the rank is known only once the program set up its process group
        self.info.labels(str(metadata.get("rank")), str(metadata.get("world_size")), str(metadata.get("hostname")),
                         str(metadata.get("run_id"))).set(1)

    def close(self) -> None:
        """Stop serving and join the server's thread, so that the port is free and no thread of
        ours is left for the interpreter's finalisation."""
        try:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
        except Exception as e:
            log.warning("commdebug: metrics server did not stop cleanly: %s", e)
