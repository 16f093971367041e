"""commdebug on torch's debug server (``torch.distributed.debug.start_debug_server``, torch 2.10+,
experimental): ``commdebug run --debug-server PORT``.

Every rank runs torch's worker server; commdebug registers a handler there, ``commdebug``, that
answers the rank's live state (:class:`~commdebug.analysis.watch.RankLive`, as JSON) from the
session's stream. Rank 0 runs torch's HTTP frontend on PORT with a ``/commdebug`` page: it asks
every rank's worker, then gives the same verdict as ``commdebug watch`` (stalled ranks,
stragglers, the collectives ranks wait in), across nodes, without a shared file system;
``/commdebug/json`` gives it as JSON.

Like torch's server it has no authentication: trusted networks only (docs/debug-server.md).
"""

from __future__ import annotations

import html
import json
import logging
import os
import time
import urllib.request
from typing import Any

from commdebug.analysis.watch import RankLive, live_state, watch
from commdebug.render.watch import render_watch

__all__ = ["DebugServer", "HANDLER"]

log = logging.getLogger("commdebug")
HANDLER = "commdebug"  # the worker handler's name: /handler/commdebug on each rank's worker server
LAST_EVENTS = 64  # the events a rank's answer is made from
FETCH_TIMEOUT_S = 10.0


class DebugServer:
    """torch's debug server with commdebug's worker handler and frontend page."""

    def __init__(self, port: int, streamer: Any, stall_after: float = 60.0) -> None:
        self.port = port
        self.streamer = streamer
        self.stall_after = stall_after
        self._started = False

    def start(self) -> None:
        missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise RuntimeError(f"torch's debug server needs a launcher's {', '.join(missing)} (torchrun sets them)")
        import importlib.util

        from torch._C._distributed_c10d import _register_handler

        _register_handler(HANDLER, self._answer)
        if importlib.util.find_spec("tabulate") is not None:
            # torch's own start: its default pages on rank 0 import tabulate
            from torch.distributed.debug import start_debug_server

            start_debug_server(port=self.port, handlers=_frontend_handlers(self.stall_after))
            self._torch = True
        else:
            self._start_like_torch()
        self._started = True

    def _start_like_torch(self) -> None:
        """What ``start_debug_server`` does (a worker server on every rank, its address in the
        launcher's store, the frontend in a process of rank 0), with commdebug's page only."""
        import multiprocessing
        import socket

        from torch._C._distributed_c10d import _WorkerServer
        from torch.distributed.debug._frontend import main
        from torch.distributed.debug._store import get_rank, tcpstore_client

        self._worker = _WorkerServer("::", 0)
        tcpstore_client().set(f"rank{get_rank()}", f"http://{socket.gethostname()}:{self._worker.port}")
        if get_rank() == 0:
            self._frontend = multiprocessing.Process(
                target=main, daemon=True,
                kwargs={"port": self.port, "dump_dir": None, "dump_interval": 60.0, "enabled_dumps": set(),
                        "handlers": _frontend_handlers(self.stall_after), "fetch_timeout": FETCH_TIMEOUT_S})
            self._frontend.start()

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if getattr(self, "_torch", False):
                from torch.distributed.debug import stop_debug_server

                stop_debug_server()
                return
            if getattr(self, "_frontend", None) is not None:
                self._frontend.terminate()
                self._frontend.join(timeout=5)
            self._worker.shutdown()
        except Exception:
            pass

    def state(self) -> RankLive:
        """This rank's live state, from what its stream wrote."""
        s = self.streamer
        with s._lock:
            events = list(s.kept.values())[-LAST_EVENTS:]
            in_flight = dict(s.in_flight)
            step, progress = s.step, s.last_progress
        meta = s.mode.trace.metadata
        rank = meta.get("rank")
        return live_state(events, rank=int(rank if isinstance(rank, int) else os.environ.get("RANK", 0)), step=step,
                          progress=progress, heartbeat=time.time(), in_flight=in_flight, hostname=meta.get("hostname"),
                          older_steps=s.older.steps)

    def _answer(self, request: Any, response: Any) -> None:
        # runs on the worker server's thread, whatever the training thread is doing
        try:
            body, status = json.dumps(self.state().to_dict()).encode(), 200
        except Exception as e:
            body, status = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), 500
        response.set_content(body, "application/json")
        response.set_status(status)


def _frontend_handlers(stall_after: float) -> list[Any]:
    """torch's own pages when their optional dependencies are there, and commdebug's."""
    from torch.distributed.debug._frontend import DebugHandler, NavLink, Route

    class CommdebugPage(DebugHandler):
        """``/commdebug``: every rank's live state and the verdict; ``/commdebug/json``: as JSON."""

        def routes(self) -> list[Any]:
            return [Route("/commdebug", self._page), Route("/commdebug/json", self._json)]

        def nav_links(self) -> list[Any]:
            return [NavLink("/commdebug", "commdebug")]

        def _result(self, request: Any) -> tuple[Any, list[str]]:
            states, errors = fetch_states(self.fetch_timeout if self.fetch_timeout else FETCH_TIMEOUT_S)
            try:  # ?stall_after=S&behind_pct=X, as `commdebug watch` takes them
                stall = float(request.get_query_arg("stall_after", stall_after, float))
                behind = float(request.get_query_arg("behind_pct", 10.0, float))
            except ValueError:
                stall, behind = stall_after, 10.0
            result = watch(states, stall_after=stall, behind_pct=behind)
            result.notes += errors
            return result, errors

        def _page(self, request: Any) -> bytes:
            result, _ = self._result(request)
            text = html.escape(render_watch(result, "(torch debug server)"))
            return (f"<!doctype html><meta charset='utf-8'><title>commdebug</title><h1>commdebug: live state of every rank</h1>"
                    f"<pre>{text}</pre><p><a href='/commdebug/json'>as JSON</a></p>").encode()

        def _json(self, request: Any) -> bytes:
            result, _ = self._result(request)
            return json.dumps(result.to_dict()).encode()

    handlers: list[Any] = []
    try:
        from torch.distributed.debug._debug_handlers import default_handlers

        handlers = default_handlers()
    except ImportError:  # torch's pages need tabulate and requests or aiohttp; ours need neither
        pass
    return [*handlers, CommdebugPage()]


def fetch_states(timeout: float) -> tuple[list[RankLive], list[str]]:
    """Every rank's answer to the ``commdebug`` worker handler, and a line per rank that did not answer."""
    from torch.distributed.debug._store import get_world_size, tcpstore_client

    store = tcpstore_client()
    world = get_world_size()
    addresses = store.multi_get([f"rank{r}" for r in range(world)])
    states, errors = [], []
    for rank, address in enumerate(addresses):
        url = f"{address.decode()}/handler/{HANDLER}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=timeout) as reply:
                states.append(RankLive.from_dict(json.loads(reply.read())))
        except Exception as e:
            errors.append(f"rank {rank} did not answer ({url}): {type(e).__name__}: {e}")
    return states, errors
