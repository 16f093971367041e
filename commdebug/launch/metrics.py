"""Prometheus metrics of a running rank: ``commdebug run --metrics-port P`` serves ``/metrics``
on port P + LOCAL_RANK, with the ``prometheus_client`` library (names, labels and units in
docs/metrics.md); at exit the rank's final values go beside its dump (``rank<R>.prom``, the
text exposition format node_exporter's textfile collector reads) and, with ``--metrics-push
URL``, to a Pushgateway.

Fed by the session's stream (:class:`~commdebug.launch.stream.Streamer` listeners) from its
background thread or at step boundaries, never per collective on the training thread: counters
lag the program by at most a flush interval, and the stream's last flush at exit brings them to
the final count before the file is written and the push sent. Every series carries ``rank``
and ``host``; the rest of the labels are bounded: op, group (its label, ``mesh_tp[4]``), phase;
no module label.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from commdebug.fileio import write_output
from commdebug.model.trace import CollectiveEvent

__all__ = ["Metrics", "metrics_port", "PUSH_TIMEOUT_S", "PUSH_JOB"]

log = logging.getLogger("commdebug")

# seconds: 10 us to 100 s, as collectives range from a tiny all_reduce to a stuck one
LATENCY_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 100.0)
# bytes/s, Prometheus' base unit: 10 MB/s to 800 GB/s (nccl-tests' bus bandwidth convention)
BUSBW_BUCKETS = tuple(gbps * 1e9 for gbps in (0.01, 0.1, 0.5, 1, 2, 5, 10, 25, 50, 100, 200, 400, 800))
_OBSERVED_MOST = 100_000
PUSH_TIMEOUT_S = 5.0  # the longest a rank's exit waits for the Pushgateway
PUSH_JOB = "commdebug"  # the Pushgateway's job label; grouped further by run_id and rank


def metrics_port(base: int, env: dict[str, str] | None = None) -> int:
    """The port this process serves on: ``base`` + its LOCAL_RANK (0 without one)."""
    local = (os.environ if env is None else env).get("LOCAL_RANK", "0")
    return base + (int(local) if local.isdigit() else 0)


class Metrics:
    """A registry of commdebug's metrics, and the HTTP server exposing it when given a `port`
    (see the module docstring).

    >>> metrics = Metrics(9400)                                   # doctest: +SKIP
    >>> metrics.finish(Path("traces"), push="http://pushgateway:9091")   # doctest: +SKIP
    """

    def __init__(self, port: int | None, address: str = "0.0.0.0") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.port = port
        self.registry = CollectorRegistry()
        who = ("rank", "host")
        labels = (*who, "op", "group", "phase")
        self.collectives = Counter("commdebug_collectives", "Collectives issued by this rank", labels, registry=self.registry)
        self.bytes = Counter("commdebug_bytes", "Message bytes (S, as nccl-tests) of the collectives issued", labels,
                             registry=self.registry)
        self.latency = Histogram("commdebug_collective_latency_seconds", "Time of each timed collective (with --timing)",
                                 (*who, "op", "group"), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.busbw = Histogram("commdebug_collective_busbw_bytes_per_second",
                               "Bus bandwidth of each timed collective (nccl-tests' convention), bytes per second",
                               (*who, "op", "group"), buckets=BUSBW_BUCKETS, registry=self.registry)
        self.step = Gauge("commdebug_step", "The step this rank is in (from 0)", who, registry=self.registry)
        self.in_flight = Gauge("commdebug_collectives_in_flight", "Collectives unfinished for 2 s or more", who,
                               registry=self.registry)
        self.last_progress = Gauge("commdebug_last_progress_timestamp_seconds",
                                   "Wall time (Unix seconds) of the end of this rank's last finished collective", who,
                                   registry=self.registry)
        self.info = Gauge("commdebug_rank_info", "This rank: always 1, its labels say which",
                          (*who, "world_size", "hostname", "run_id"), registry=self.registry)
        self._observed: set[int] = set()
        self._flagged: set[int] = set()
        self._progress = 0.0
        self._who: tuple[str, str] | None = None
        self.run_id: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        if port is not None:
            self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)

    def observe(self, step: int, metadata: dict[str, Any], new: list[CollectiveEvent], again: list[CollectiveEvent]) -> None:
        """Count the events written for the first time; time those timed (once each)."""
        who = (str(metadata.get("rank")), str(metadata.get("hostname")))
        if who != self._who:  # the rank is known only once the program set up its process group
            self._relabel(who, metadata)
        rank, host = who
        self.step.labels(rank, host).set(step)
        for e in new:
            labels = (rank, host, e.op, e.group.label, e.phase)
            self.collectives.labels(*labels).inc()
            if e.size_bytes is not None:  # a size not known adds nothing
                self.bytes.labels(*labels).inc(e.size_bytes)
        origin = metadata.get("start_wall_s")
        for e in (*new, *again):
            if e.in_flight:
                self._flagged.add(e.index)
                continue
            self._flagged.discard(e.index)
            # a call's end on the wall clock: its start plus its time where both are known, else now
            end = (origin + e.start_s + (e.latency_s or 0.0) if isinstance(origin, float) and e.start_s is not None
                   else time.time())
            self._progress = max(self._progress, end)
            if e.latency_s is not None and e.index not in self._observed:
                self._observed.add(e.index)
                self.latency.labels(rank, host, e.op, e.group.label).observe(e.latency_s)
                busbw = e.busbw_gbps
                if busbw is not None:
                    self.busbw.labels(rank, host, e.op, e.group.label).observe(busbw * 1e9)
        if self._progress:
            self.last_progress.labels(rank, host).set(self._progress)
        self.in_flight.labels(rank, host).set(len(self._flagged))
        if len(self._observed) > _OBSERVED_MOST:  # only recent events can still get their time
            newest = max(self._observed)
            self._observed = {i for i in self._observed if i > newest - _OBSERVED_MOST // 2}

    def _relabel(self, who: tuple[str, str], metadata: dict[str, Any]) -> None:
        """Series under the rank's old labels (before its process group existed, it reads as
        rank 0) are dropped: one rank, one set of series."""
        if self._who is not None:
            for metric in (self.collectives, self.bytes, self.latency, self.busbw, self.step, self.in_flight, self.last_progress):
                metric.clear()
        self._who = who
        run = metadata.get("run_id")
        self.run_id = run if isinstance(run, str) else None
        self.info.clear()
        self.info.labels(*who, str(metadata.get("world_size")), str(metadata.get("hostname")), str(run)).set(1)

    def text(self) -> str:
        """The metrics now, in Prometheus' text exposition format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode("utf-8")

    def finish(self, out: Path, push: str | None = None, timeout_s: float = PUSH_TIMEOUT_S) -> Path | None:
        """At exit: write the final values to ``out/rank<R>.prom`` and, with `push` (a
        Pushgateway's URL), send them there, grouped by job ``commdebug``, run id and rank,
        waiting `timeout_s` at most. Nothing here raises: a rank's exit status is its program's.
        Returns the file written (None: the rank never recorded)."""
        if self._who is None:
            return None
        rank = self._who[0]
        path = None
        try:
            path = write_output(out / f"rank{rank}.prom", self.text())
        except Exception as e:
            log.warning("commdebug: could not write the final metrics to %s: %s", out / f"rank{rank}.prom", e)
        if push:
            self._push(push, rank, timeout_s)
        return path

    def _push(self, url: str, rank: str, timeout_s: float) -> None:
        """PUT the registry to the Pushgateway from a thread joined for at most `timeout_s` (the
        request itself times out then too: a name that never resolves cannot hold the exit)."""
        from prometheus_client import push_to_gateway

        grouping = {"rank": rank, **({"run_id": self.run_id} if self.run_id else {})}
        failed: list[BaseException] = []

        def send() -> None:
            try:
                push_to_gateway(url, job=PUSH_JOB, registry=self.registry, grouping_key=grouping, timeout=timeout_s)
            except BaseException as e:  # reported by the waiting thread
                failed.append(e)

        thread = threading.Thread(target=send, name="commdebug-metrics-push", daemon=True)
        thread.start()
        thread.join(timeout_s + 0.5)
        if thread.is_alive():
            log.warning("commdebug: the Pushgateway at %s did not answer within %.0f s; rank %s's final metrics are only in its .prom file",
                        url, timeout_s, rank)
        elif failed:
            log.warning("commdebug: could not push rank %s's final metrics to %s: %s", rank, url, failed[0])

    def close(self) -> None:
        """Stop serving and join the server's thread, so that the port is free and no thread of
        ours is left for the interpreter's finalisation."""
        if self._server is None:
            return
        try:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
        except Exception as e:
            log.warning("commdebug: metrics server did not stop cleanly: %s", e)
