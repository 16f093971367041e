"""commdebug on torch's debug server (``torch.distributed.debug.start_debug_server``, torch 2.10+,
experimental): ``commdebug run --debug-server PORT``.

Every rank runs torch's worker server; commdebug registers a handler there, ``commdebug``, that
answers the rank's live state (:class:`~commdebug.analysis.watch.RankLive`, as JSON) from the
session's stream. Rank 0 runs torch's HTTP frontend on PORT, on threads of its own process (never a
fork: nothing of it can outlive the rank), with a ``/commdebug`` page: it asks
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
    """torch's debug server pieces with commdebug's worker handler and frontend page, all inside
    this process: a worker server on every rank, the frontend's HTTP threads on rank 0.

    torch's own ``start_debug_server`` forks rank 0 for the frontend; a fork of a recorded rank
    carries its SIGTERM handler and session (it wrote rank 0's dump again when terminated), and
    outlived a killed job holding its ports. Threads cannot outlive their process, and
    :meth:`stop` joins them before the interpreter ends.
    """

    def __init__(self, port: int, streamer: Any, stall_after: float = 60.0) -> None:
        self.port = port
        self.streamer = streamer
        self.stall_after = stall_after
        self._worker: Any = None
        self._frontend: Any = None

    def start(self) -> None:
        missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise RuntimeError(f"torch's debug server needs a launcher's {', '.join(missing)} (torchrun sets them)")
        import socket

        from torch._C._distributed_c10d import _WorkerServer
        from torch.distributed.debug._store import get_rank, tcpstore_client

        global _current
        _register_once()
        _current = self
        self._worker = _WorkerServer("::", 0)
        tcpstore_client().set(f"rank{get_rank()}", f"http://{socket.gethostname()}:{self._worker.port}")
        if get_rank() == 0:
            self._frontend = _start_frontend(self.port, _frontend_handlers(self.stall_after))

    def stop(self) -> None:
        """Stop serving and join every thread this server started (rank 0's frontend first: its
        requests ask the worker servers)."""
        global _current
        if _current is self:
            _current = None
        frontend, self._frontend = self._frontend, None
        if frontend is not None:
            try:
                frontend._server.shutdown()  # returns once serve_forever has returned
                frontend._server.server_close()  # joins the requests still being answered
                frontend._thread.join(timeout=FETCH_TIMEOUT_S + 5)
            except Exception as e:
                log.warning("commdebug: debug server frontend did not stop cleanly: %s", e)
        worker, self._worker = self._worker, None
        if worker is not None:
            try:
                worker.shutdown()
            except Exception as e:
                log.warning("commdebug: debug server worker did not stop cleanly: %s", e)

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


_current: DebugServer | None = None  # the server the worker handler answers for
_registered = False


def _answer(request: Any, response: Any) -> None:
    # runs on the worker server's thread, whatever the training thread is doing
    server = _current
    try:
        if server is None:
            raise RuntimeError("this rank's recording has finished")
        body, status = json.dumps(server.state().to_dict()).encode(), 200
    except Exception as e:
        body, status = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), 500
    response.set_content(body, "application/json")
    response.set_status(status)


def _register_once() -> None:
    """Register :func:`_answer` with torch's handler registry, once per process, for good.

    The registry is a C++ static: it drops its handlers after the interpreter has finalised, with
    no thread state. Freeing a Python object then (a bound method's dealloc asks for the thread
    state) aborts the process with ``Fatal Python error: PyThreadState_Get``: a healthy rank exits
    -6 and its launcher fails the job. So the registry holds a module-level function whose one
    extra reference is never given back: its count never reaches zero there."""
    global _registered
    if _registered:
        return
    import ctypes

    from torch._C._distributed_c10d import _register_handler

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_answer))
    _register_handler(HANDLER, _answer)
    _registered = True


def _start_frontend(port: int, handlers: list[Any]) -> Any:
    """torch's frontend (an HTTP server on its own thread) in this process, its requests
    answered on threads that :meth:`DebugServer.stop` joins."""
    from torch.distributed.debug._frontend import FrontendServer

    for handler in handlers:
        handler.fetch_timeout = FETCH_TIMEOUT_S
    frontend = FrontendServer(port=port, handlers=handlers)
    # ThreadingHTTPServer's request threads are daemons nobody joins; ours are joined on close
    frontend._server.daemon_threads = False
    frontend._server.block_on_close = True
    log.info("commdebug: debug server frontend on port %d", frontend._server.server_port)
    return frontend


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
