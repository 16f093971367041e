"""One process's recording, from start to a dump on disk, whatever way the process ends.

A :class:`RecordingSession` enters a CommDebugMode for a whole program (``commdebug run`` or the
start-up hook) and writes ``<out>/rank<R>.json`` once, when the program ends normally, raises,
calls ``sys.exit`` or ``os._exit`` (from the thread that records), or receives SIGTERM (the
handler writes the dump, then lets the signal do what it would have done). Meanwhile it streams what it records to ``<out>/rank<R>.jsonl``
(:mod:`commdebug.launch.stream`), which the final dump replaces: a rank killed with SIGKILL
leaves its stream. It also serves the live state when asked (Prometheus metrics, torch's
debug server: :mod:`commdebug.launch.services`). With a hang timeout, a watchdog thread writes the dump as soon as a
collective has been in flight that long, with that collective marked (``in_flight``), and logs
which one; it never kills the program: the launcher's or the backend's timeout does that.
A process that dies of a fatal signal (SIGSEGV, SIGABRT, ...) runs none of this: it leaves a
fault record, ``<out>/rank<R>.fault`` (:mod:`commdebug.launch.faults`).

On SIGTERM the rank says so on stderr at once, before it writes its dump (a launcher may kill
it a moment later), and again when the dump is on disk (through ``on_finish``, or its own line).

A process that never initialised torch.distributed and recorded nothing (the launcher itself,
a DataLoader worker) writes nothing.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from commdebug.capture.config import SESSION_OPTIONS, check_option as _check_option
from commdebug.debug_mode import CommDebugMode
from commdebug.errors import CommDebugError
from commdebug.fileio import output_folder, write_output
from commdebug.launch.faults import FaultRecorder
from commdebug.launch.profiling import StepProfiler
from commdebug.launch.services import Services
from commdebug.launch.stream import Streamer
from commdebug.model.dump import dump_text
from commdebug.model.fault import NORMAL_ENDINGS

__all__ = ["RecordingSession", "rank_of", "say"]

log = logging.getLogger("commdebug")
THREAD_POLL_S = 0.5  # how often the session's threads look whether the recording has finished


def rank_of(meta: dict[str, Any]) -> int:
    """This process's global rank: torch.distributed's, else the launcher's RANK, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    if os.environ.get("RANK", "").isdigit():
        return int(os.environ["RANK"])
    return int(meta.get("rank") or 0)


def say(line: str) -> None:
    """One ``commdebug:`` line on stderr, written whole by one system call: safe in a signal
    handler's Python code (the program may have been writing to ``sys.stderr`` when the signal
    came) and as the last thing a process does before a launcher kills it."""
    try:
        sys.stderr.flush()  # what the program printed comes first
    except Exception:
        pass
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _launcher_rank() -> int | None:
    rank = os.environ.get("RANK", "")
    return int(rank) if rank.isdigit() else None


class RecordingSession:
    """Record a whole program and write its dump however it ends.

    >>> session = RecordingSession("traces", hang_timeout=300, timing="sync")   # doctest: +SKIP
    >>> session.start(); run_the_program(); session.finish()                      # doctest: +SKIP

    ``on_finish(session, path)`` is called once, when the final dump is on disk, whether the
    program returned, raised or got SIGTERM (``path`` is None when the process wrote nothing);
    without one, a rank ended by SIGTERM says itself that its dump is complete.
    """

    def __init__(self, out_dir: str | os.PathLike, *, hang_timeout: float | None = None, noise_level: int = 3, html: bool = True,
                 on_finish: Callable[[RecordingSession, Path | None], None] | None = None, **options: Any) -> None:
        self.out = output_folder(out_dir, "trace folder")
        if hang_timeout is not None and hang_timeout <= 0:
            raise CommDebugError(f"hang timeout must be a positive number of seconds, got {hang_timeout}")
        # the session's own options (stream, keep_steps, metrics_port, debug_server) resolve with
        # the mode's (environment, config file, arguments) and are read back from it
        self.mode = CommDebugMode(**{k: v for k, v in options.items() if k not in SESSION_OPTIONS})
        given = {k: v for k, v in options.items() if k in SESSION_OPTIONS}
        self.options = replace(self.mode.options, **{k: _check_option(k, v) for k, v in given.items()}) if given else self.mode.options
        self.streamer: Streamer | None = None
        self.profiler: StepProfiler | None = None
        self.faults = FaultRecorder(self.out)
        self.services = Services(self)
        self.hang_timeout = hang_timeout
        self.noise_level = noise_level
        self.html = html
        self.on_finish = on_finish  # (session, path or None): the end, however the process ends
        self.written: Path | None = None
        self.reason = ""
        self._lock = threading.RLock()
        self._finished = False
        self._stop = threading.Event()
        self._previous_sigterm: Any = None
        self._hang_reported: tuple[int, ...] = ()
        self._owner: int | None = None
        self._pid = os.getpid()
        self._os_exit: Callable[[int], NoReturn] = os._exit  # as it was before ours (start) replaced it
        self._finishing: int | None = None
        self._pending_signal = False
        self._announced = False
        self._threads: list[threading.Thread] = []  # ours, joined when the recording finishes
        self._wakeup: tuple[socket.socket, socket.socket] | None = None  # the signal watcher's wakeup fd, if ours

    # ---- life cycle ---------------------------------------------------------------------------

    def start(self) -> RecordingSession:
        """Enter the mode (in the calling thread: dispatch modes are per thread) and install the
        SIGTERM handler and, with a hang timeout, the watchdog."""
        self.mode.__enter__()
        self._owner = threading.get_ident()
        # a program that leaves with os._exit (past the interpreter's teardown, docs/ranks.md)
        # runs no atexit handler: ours writes the dump first
        os._exit = self._leave
        self.faults.arm(_launcher_rank(), None)
        self.mode.add_step_listener(self._at_step)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._watch_signals()
        if self.hang_timeout is not None:
            self._start_thread(self._watch, "commdebug-hang-watchdog")
        if self.options.stream:
            self.streamer = Streamer(self.mode, self.out, rank_of=rank_of, keep_steps=self.options.keep_steps).start()
        if self.options.profile_steps is not None:
            self.profiler = StepProfiler(self.mode, self.out, self.options.profile_steps, rank_of=rank_of).start()
        self.services.start()
        return self

    def finish(self, reason: str = "exit") -> Path | None:
        """Leave the mode (when called where it was entered) and write the dump; once."""
        with self._lock:
            if self._finished:
                return self.written
            self._finished = True
            self._finishing = threading.get_ident()
            if os._exit == self._leave:
                os._exit = self._os_exit  # type: ignore[assignment]  # the same function, typed less exactly
            self._stop.set()
            self.reason = reason
            self.mode.remove_step_listener(self._at_step)
            if self.profiler is not None:  # its file first: the dump says whether it was written
                self.profiler.finish(quiet=not self.recorded)  # a process that took no part says nothing
            if threading.get_ident() == self._owner:  # dispatch modes are per thread
                try:
                    self.mode.__exit__(None, None, None)
                except Exception:  # the program left the mode stack in another state
                    pass
            try:
                path = self._write(final=True)
                if self.streamer is not None:  # the dump holds all it held, and more
                    self.streamer.close(remove=path is not None)
                self.services.stop()
                self._join_threads()
                if self.on_finish is not None:
                    self.on_finish(self, path)
                elif path is not None and reason == "SIGTERM":
                    say(f"commdebug: rank {rank_of(self.mode.trace.metadata)} (pid {os.getpid()}) ended by SIGTERM; "
                        f"dump complete: {path}")
                return path
            finally:
                self._finishing = None
                if self._pending_signal:
                    self._on_sigterm(signal.SIGTERM, None)

    def _leave(self, status: int) -> NoReturn:
        """``os._exit`` while recording: the dump first, when the thread that records in this
        process leaves; a forked child or another thread leaves at once, as os._exit does."""
        if os.getpid() == self._pid and threading.get_ident() == self._owner:
            try:
                self.finish(f"os._exit({status})")
            except BaseException:  # nothing of ours keeps a process from leaving
                pass
        self._os_exit(status)

    @property
    def recorded(self) -> bool:
        """Whether this process took part in the job (joined a process group or recorded a
        collective): only then does it write a dump."""
        return bool(self.mode.trace.metadata.get("backend")) or self.mode.get_total_counts() > 0

    def announce(self, how: str) -> None:
        """Say how the program ended, once, before the dump is written: a rank killed while it
        writes (a launcher's grace period is short) has still said it. Nothing for a process
        that recorded nothing, or when the dump is already written or being written."""
        if self._announced or self._finished or not self.recorded:
            return
        self._announced = True
        meta = self.mode.trace.metadata
        rank = rank_of(meta)
        say(f"commdebug: rank {rank} (pid {os.getpid()}): program {how}; writing its dump to {self.out / f'rank{rank}.json'}")

    def _at_step(self, step: int) -> None:
        self._arm_faults()

    def _arm_faults(self) -> None:
        """Name the fault record after the rank (and run) as soon as they are known; cheap when
        nothing changed (it runs at every step boundary)."""
        meta = self.mode.trace.metadata
        rank = meta.get("rank") if meta.get("backend") else _launcher_rank()
        run = meta.get("run_id")
        self.faults.arm(rank if isinstance(rank, int) else None, run if isinstance(run, str) else None)

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _join_threads(self) -> None:
        """Join the session's threads (the one finishing excepted): a thread of ours still running
        when the interpreter finalises can crash it, turning a healthy rank's exit into an abort."""
        if self._wakeup is not None:  # the signal watcher looks at once, not at its next poll
            try:
                self._wakeup[1].send(b"\0")
            except OSError:
                pass
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=THREAD_POLL_S * 4)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._finishing == threading.get_ident():
            # SIGTERM while this thread writes the final dump (it runs between bytecodes):
            # finish writing, then act on it
            self._pending_signal = True
            return
        self._pending_signal = False
        self.announce("ended by SIGTERM")
        self.finish(reason="SIGTERM")
        previous = self._previous_sigterm
        signal.signal(signal.SIGTERM, previous if previous not in (None, self._on_sigterm) else signal.SIG_DFL)
        if callable(previous) and previous not in (signal.SIG_IGN, signal.SIG_DFL):
            previous(signum, frame)  # the program's own handler decides
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGTERM)  # die of it, as without us

    def _watch_signals(self) -> None:
        """Write the dump on SIGTERM even while the main thread is blocked inside a collective.

        Python runs signal handlers only when the main thread is back in the interpreter; a rank
        stuck in a gloo or NCCL wait never is, and the launcher kills it after its grace period,
        losing the recording. Python's C-level handler does write the signal number to the
        wakeup fd at once, so a thread reading it can write the dump first. (A program that sets
        its own wakeup fd, as asyncio does, keeps it; then only the handler above acts.)"""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            return
        if previous != -1:  # someone else's: give it back
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return
        self._wakeup = (reader, writer)  # keep both open for the life of the process

        def wait() -> None:
            while not self._finished:
                try:  # wakes up now and then to end with the recording, never left for finalisation
                    if not select.select([reader], [], [], THREAD_POLL_S)[0]:
                        continue
                    data = reader.recv(64)
                except (OSError, ValueError):
                    return
                if not data:
                    return
                # only while SIGTERM is ours: a program with its own handler may survive it
                if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    self.announce("ended by SIGTERM")
                    self.finish(reason="SIGTERM")

        self._start_thread(wait, "commdebug-signal-watch")

    # ---- writing ------------------------------------------------------------------------------

    def _write(self, final: bool) -> Path | None:
        trace = self.mode.trace
        meta = trace.metadata
        if not self.recorded:
            return None  # this process took no part in the job (launcher, data worker)
        self.mode.refresh_metadata()
        self._arm_faults()
        # a hang that then ended in the backend's timeout error: its Work reads "completed", but
        # the dump should still say where the program was stuck
        hung = self._hang_reported if final and self.reason not in NORMAL_ENDINGS else ()
        stuck = self.mode.mark_in_flight(also=hung)
        # every collective of this dump not flagged in_flight had finished: `check` takes a
        # finished call as proof that every member of its group issued it
        meta["unfinished_marked"] = True
        meta["ended_by"] = self.reason if final else "hang"
        if final and self.mode.recording:  # left entered: finished from another thread (SIGTERM's watcher)
            self.mode.stamp_end()
        rank = rank_of(meta)
        path = self.out / f"rank{rank}.json"
        events, older = self.streamer.final() if final and self.streamer is not None else (None, None)
        write_output(path, dump_text(self.mode.refresh(), self.noise_level, events, older))
        if final and self.html and rank == 0:
            self._write_html(path.with_suffix(".html"), path.name)
        self.written = path
        if stuck and final:
            log.warning("commdebug: rank %d ended with %d collective(s) unfinished; see %s", rank, len(stuck), path)
        return path

    def _write_html(self, page: Path, dump_name: str) -> None:
        """The viewer page of the trace just dumped, from the trace itself (not the file)."""
        try:
            import visualizer

            write_output(page, visualizer.render_html(self.mode.trace, title=f"commdebug: {dump_name}", noise_level=self.noise_level))
        except Exception as e:  # the dump is what matters; say why the page is missing
            log.warning("commdebug: could not write the viewer page %s: %s", page, e)

    # ---- hang watchdog ------------------------------------------------------------------------

    def _watch(self) -> None:
        timeout = float(self.hang_timeout or 0)
        while not self._stop.wait(min(1.0, timeout / 4)):
            stuck = self.mode.in_flight(older_than_s=timeout)
            key = tuple(e.index for e, _ in stuck)
            if not stuck or key == self._hang_reported:
                continue
            self._hang_reported = key
            event, age = stuck[0]
            with self._lock:
                if self._finished:
                    return
                path = self._write(final=False)
            where = f" at {event.source}" if event.source else ""
            log.warning(
                "commdebug: rank %d stuck for %.0f s in %s #%s on group %s (module %s)%s; dump written to %s",
                rank_of(self.mode.trace.metadata), age, event.op, event.seq if event.seq is not None else f"{event.p2p_seq} (point-to-point, peer rank {event.peer})",
                event.group.label, event.module, where, path,
            )
