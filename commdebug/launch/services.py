"""What a recording session serves while the program runs, when asked: Prometheus metrics
(``metrics_port``, :mod:`commdebug.launch.metrics`; at exit their final values beside the dump
and, with ``metrics_push``, to a Pushgateway) and a handler on torch's debug server
(``debug_server``, :mod:`commdebug.launch.debug_server`). Both read the session's stream as it
is written, never the training thread's hot path. A service that cannot start (a port in use,
a missing library) is one warning; the program runs on.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["Services"]

log = logging.getLogger("commdebug")


class Services:
    """The session's live services; :meth:`start` after the stream is set up, :meth:`stop` at the end."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.metrics: Any = None
        self.debug: Any = None

    def start(self) -> None:
        options = self.session.options
        streamer = self.session.streamer
        metrics = options.metrics_port is not None or options.metrics_push is not None
        if streamer is None:
            if metrics or options.debug_server is not None:
                log.warning("commdebug: metrics and the debug server read the stream; they are off with stream=false")
            return
        if metrics:
            self._start_metrics(options.metrics_port, streamer)
        if options.debug_server is not None:
            self._start_debug_server(options.debug_server, streamer)

    def _start_metrics(self, base: int | None, streamer: Any) -> None:
        from commdebug.launch.metrics import Metrics, metrics_port

        port = None if base is None else metrics_port(base)  # None: --metrics-push alone, nothing served
        try:
            self.metrics = Metrics(port)
        except Exception as e:  # a port in use: the program matters more than its metrics
            log.warning("commdebug: no metrics: cannot serve on port %s: %s", port, e)
            return
        trace = self.session.mode.trace
        streamer.listeners.append(lambda new, again: self.metrics.observe(streamer.step, trace.metadata, new, again))

    def _start_debug_server(self, port: int, streamer: Any) -> None:
        from commdebug.launch.debug_server import DebugServer

        try:
            self.debug = DebugServer(port, streamer)
            self.debug.start()
        except Exception as e:
            log.warning("commdebug: no debug server on port %d: %s", port, e)
            self.debug = None

    def stop(self) -> None:
        """At the end, after the stream's last flush: the metrics' final values beside the dump
        (and to the Pushgateway), then every service stopped."""
        if self.metrics is not None:
            if self.session.recorded:
                self.metrics.finish(self.session.out, self.session.options.metrics_push)
            self.metrics.close()
            self.metrics = None
        if self.debug is not None:
            self.debug.stop()
            self.debug = None
