"""A recording session's stream: what the rank recorded, appended to ``<out>/rank<R>.jsonl``
while it runs, so that a rank killed with SIGKILL (the OOM killer, the scheduler), aborted inside
a collective, or lost with its node leaves what it did (docs/streaming.md; format in
:mod:`commdebug.model.stream`).

When it writes:

- each collective as it is issued, from the thread that issued it (an ``issued`` line, one
  ``write``, before anything waits for the call): a process killed at any moment after that
  keeps the call, whatever killed it (SIGKILL, a native abort inside the collective), short of
  the machine going down;
- at every step boundary, from the training thread (a boundary is where a step's events are
  complete; the cost is one encode and one ``write`` of that step's events, no ``fsync``);
- every ``interval`` seconds from a background thread, when a step is long, when a collective
  has been unfinished for a while (the event is written again, flagged ``in_flight``), or when
  an event changed since it was written (its time arrived, it failed);
- ``fsync`` from the background thread, at most every ``fsync_s`` seconds: a write that reached
  the kernel survives the process's death; only a crash of the machine needs the fsync.

A chunk's events supersede their ``issued`` lines, which the background thread then drops from
the file now and then (atomically, :meth:`Streamer._compact`): the file keeps the compact chunks.

With ``keep_steps`` the raw events of the last N steps (and of detail steps) stay; older ones
are folded into totals (:class:`~commdebug.model.aggregates.Aggregates`) and the file is
rewritten (atomically) when it holds twice that: its size stays bounded whatever the run's length.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

from commdebug.model.aggregates import Aggregates
from commdebug.model.dump import SCHEMA_VERSION
from commdebug.model.stream import STREAM_SUFFIX, chunk_line, header_line, issued_line, older_line
from commdebug.model.trace import CollectiveEvent, GroupInfo

__all__ = ["Streamer", "STUCK_S"]

log = logging.getLogger("commdebug")

STUCK_S = 2.0  # a collective unfinished this long is written again, flagged in_flight
RECENT = 64  # the last events written, looked at again for changes (an error, a late time)
WATCH_MOST = 20_000  # bound on the events looked at again
SLACK = 4096  # events the program may add between reading the count and the events
COMPACT_BYTES = 4 << 20  # issued lines the file may hold before they are dropped (or half its size)
_ISSUED = b'{"kind":"issued"'


class Streamer:
    """Stream one recorder's events to ``<out>/rank<R>.jsonl`` (see the module docstring).

    >>> streamer = Streamer(mode, Path("traces"), rank_of=lambda meta: 0, keep_steps=50)   # doctest: +SKIP
    >>> streamer.start(); ...; events, older = streamer.final(); streamer.close(remove=True)  # doctest: +SKIP

    ``listeners`` are called (from whichever thread flushed) with the new events and the events
    written again, after each chunk: metrics and the debug server's state read them there.
    ``issue_log``: write each collective as it is issued (the default), not only in chunks.
    """

    def __init__(self, mode: Any, out: Path, *, rank_of: Callable[[dict[str, Any]], int], keep_steps: int | None = None,
                 interval: float = 1.0, fsync_s: float = 5.0, issue_log: bool = True) -> None:
        self.mode = mode
        self.out = out
        self.rank_of = rank_of
        self.keep_steps = keep_steps
        self.interval = interval
        self.fsync_s = fsync_s
        self.path: Path | None = None
        self.listeners: list[Callable[[list[CollectiveEvent], list[CollectiveEvent]], None]] = []
        self.kept: dict[int, CollectiveEvent] = {}  # index -> its latest written version
        self.older = Aggregates()
        self.lost = 0  # events dropped from memory (max_events) before they could be written
        self.step = 0
        self.last_progress = time.time()
        self.in_flight: list[tuple[int, float]] = []  # (index, wall time since) unfinished for STUCK_S or more
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._fd: int | None = None
        self._next = 0  # the index of the next event to write
        self._watch: dict[int, tuple[CollectiveEvent | None, bool]] = {}  # index -> (trace's version written, flagged)
        self._meta_text = ""
        self._unsynced = False
        self._synced_at = 0.0
        self._disk_from_step = 0
        self._written_at = 0.0
        self._failed = False
        self._closed = False  # the final dump replaces the file: nothing writes it again
        self._thread: threading.Thread | None = None
        self.issue_log = issue_log
        # Issued lines are written on the program's thread without self._lock (a flush may hold
        # it for a while): _fd_lock guards only the file descriptor and what goes with the file
        # (the groups it names, the issued events no chunk holds yet). Order: _lock, then _fd_lock.
        self._fd_lock = threading.Lock()
        self._named: set[str] = set()  # groups whose members the file already says
        self._chunk_named: set[str] = set()  # those of them its chunks say
        self._issued: deque[CollectiveEvent] = deque()  # issued since, not in a chunk yet: oldest first
        self._issued_bytes = 0  # issued lines written since the file was last made without them
        self._clean = 0  # bytes at the file's start that hold no issued line

    # ---- life cycle ---------------------------------------------------------------------------

    def start(self) -> Streamer:
        """Flush at the recorder's step boundaries, write each collective as it is issued, and
        start the background thread."""
        self.mode.add_step_listener(self._at_boundary)
        if self.issue_log:
            self.mode.add_issue_listener(self._issue)
        self._thread = threading.Thread(target=self._run, name="commdebug-stream", daemon=True)
        self._thread.start()
        return self

    def _at_boundary(self, step: int) -> None:
        if step != self.step:
            try:
                self.flush(boundary=True)
            except Exception as e:  # a full disk must not fail the program's optimizer.step()
                self._give_up(e)

    def stop(self) -> None:
        """Stop the background thread and the boundary flushes (the file stays open)."""
        self._stop.set()
        self.mode.remove_step_listener(self._at_boundary)
        self.mode.remove_issue_listener(self._issue)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def close(self, remove: bool) -> None:
        """Stop, sync and close the file; ``remove`` it when the final dump replaces it."""
        self.stop()
        with self._lock, self._fd_lock:
            self._closed = True
            if self._fd is not None:
                try:
                    os.fsync(self._fd)
                except OSError:
                    pass
                os.close(self._fd)
                self._fd = None
            if remove and self.path is not None:
                try:
                    self.path.unlink()
                except OSError:
                    pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
                self._compact()
                self._sync_and_beat()
            except Exception as e:  # never break the program for its recording
                self._give_up(e)
                return

    def _give_up(self, error: Exception) -> None:
        if not self._failed:
            self._failed = True
            log.warning("commdebug: streaming to %s stopped (the dump at exit is still written): %s", self.path or self.out, error)

    # ---- writing ------------------------------------------------------------------------------

    def flush(self, boundary: bool = False) -> int:
        """Write what was recorded since the last chunk (``boundary``: at a step boundary);
        returns how many events it wrote."""
        if self._failed:
            return 0
        with self._lock:
            if self._closed:  # a flush that waited for close(): at a step boundary as SIGTERM ends the run
                return 0
            trace = self.mode.trace
            meta = trace.metadata
            fd = self._fd
            if fd is None:
                if not meta.get("backend") and not trace.events_total:
                    return 0  # not part of the job (yet): no file, as for the final dump
                fd = self._open(meta)
            step = trace.step
            events = self._tail(trace)
            first = events[0].index if events else trace.events_total
            if first > self._next:
                self.lost += first - self._next
                self._next = first
            new = events[self._next - first:] if events else []
            now = time.time()
            ages = {e.index: age for e, age in self.mode.in_flight(older_than_s=STUCK_S)}
            stuck = set(ages)
            again = self._changed(events, first, stuck, boundary)
            written = [self._as_written(e, stuck) for e in new]
            again_written = [self._as_written(e, stuck) for e in again]
            if new:
                self._next = new[-1].index + 1
            meta_text = json.dumps(meta, sort_keys=True, default=str)
            changed = meta_text != self._meta_text
            if not written and not again_written and not changed and step == self.step:
                return 0
            if written or step != self.step:
                self.last_progress = now
            self.step = step
            self.in_flight = [(i, now - age) for i, age in sorted(ages.items())]
            line = chunk_line(again_written + written, time=now, step=step, events_total=trace.events_total,
                              metadata=json.loads(meta_text) if changed else None, progress=self.last_progress,
                              in_flight=self.in_flight)
            self._meta_text = meta_text
            self._write(fd, line)
            for e in again_written + written:
                self.kept[e.index] = e
            with self._fd_lock:  # the chunk holds them now, and names their groups
                names = {e.group.name for e in again_written + written}
                self._named |= names
                self._chunk_named |= names
                while self._issued and self._issued[0].index < self._next:
                    self._issued.popleft()
            self._fold(step, meta)
            for listener in self.listeners:
                listener(written, again_written)
            return len(written)

    def _tail(self, trace: Any) -> list[CollectiveEvent]:
        """The trace's last events, from the oldest one this flush may look at: one C call
        (list of islice of reversed), so the training thread cannot change it half-read."""
        lowest = min(self._next - RECENT, min(self._watch, default=self._next))
        need = trace.events_total - lowest + SLACK
        for _ in range(3):
            try:
                tail = list(islice(reversed(trace.events), max(need, 0)))
            except RuntimeError:  # changed under a garbage collection's finaliser: again
                continue
            tail.reverse()
            return tail
        return []

    def _open(self, meta: dict[str, Any]) -> int:
        self.path = self.out / f"rank{self.rank_of(meta)}{STREAM_SUFFIX}"
        # a new file: an earlier run's stream of the same rank is replaced, not appended to
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        header = header_line(json.loads(json.dumps(meta, default=str)), SCHEMA_VERSION, time.time())
        self._write(fd, header)
        with self._fd_lock:
            self._fd = fd
            self._named, self._chunk_named = set(), set()
            self._clean = len(header.encode("utf-8"))
        return fd

    # ---- each collective as it is issued ------------------------------------------------------

    def _issue(self, event: CollectiveEvent) -> None:
        """The recorder's issue listener: one line, on the program's thread, before anything
        waits for the call. Never raises: a failed write stops the stream, not the program."""
        if self._failed or self._closed:
            return
        try:
            if self._fd is None:  # the job's first collective: the file starts here
                self._open_once()
            with self._fd_lock:
                fd = self._fd
                if fd is None:  # closed meanwhile
                    return
                self._issued.append(event)
                data = self._issued_text(event).encode("utf-8")
                written = os.write(fd, data)
                if written < len(data):  # a short write: finish it (one write in practice)
                    self._write(fd, data[written:])
                self._issued_bytes += len(data)
                self._unsynced = True
        except Exception as e:  # never break the program for its recording
            self._give_up(e)

    def _open_once(self) -> None:
        """Open the file unless a flush (or another thread's first call) did meanwhile."""
        with self._lock:
            if self._fd is None and not self._closed:
                self._open(self.mode.trace.metadata)

    def _issued_text(self, event: CollectiveEvent) -> str:
        """An event's issued line, naming its group's members the first time the file names the
        group (under _fd_lock)."""
        group: GroupInfo | None = None
        if event.group.name not in self._named:
            group = event.group
            self._named.add(group.name)
        return issued_line(event, time.time(), group)

    def _issued_tail(self) -> bytes:
        """The issued lines of the events no chunk holds yet, for a file made anew (under
        _fd_lock, with _named as the new file's chunks name them)."""
        return "".join(self._issued_text(e) for e in self._issued).encode("utf-8")

    def _replace(self, tmp: Path, named: set[str]) -> None:
        """Put the finished ``tmp`` (fsynced) in the file's place, with the issued lines that no
        chunk holds yet at its end, and write on from there: under _fd_lock, so that no issued
        line goes to the old file once the new one is read."""
        assert self.path is not None
        with self._fd_lock:
            self._named = named
            tail = self._issued_tail()
            fd = os.open(tmp, os.O_WRONLY | os.O_APPEND)
            try:
                clean = os.fstat(fd).st_size
                if tail:
                    self._write(fd, tail)
            except BaseException:
                os.close(fd)
                raise
            os.replace(tmp, self.path)
            old, self._fd = self._fd, fd
            self._clean, self._issued_bytes = clean, len(tail)
        if old is not None:
            os.close(old)

    def _compact(self) -> None:
        """Drop the issued lines that chunks now hold, once they outweigh the file's clean part
        (its size stays within about twice what the chunks hold). From the background thread:
        the copy runs while the program issues on; only the new file's last lines and the
        switch to it hold _fd_lock. Atomic: a process killed meanwhile leaves the old file."""
        with self._lock:
            if self._closed or self._fd is None or self.path is None or self._issued_bytes < max(COMPACT_BYTES, self._clean // 2):
                return
            with self._fd_lock:
                size = os.fstat(self._fd).st_size
            with open(self.path, "rb") as f:
                raw = f.read(size)
            clean = raw[: self._clean]
            rest = b"".join(line + b"\n" for line in raw[self._clean:].split(b"\n") if line and not line.startswith(_ISSUED))
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                self._write(fd, clean + rest)
                os.fsync(fd)
            finally:
                os.close(fd)
            # every issued line dropped is held by a chunk that names its group; the tail's
            # lines name the groups no chunk names
            self._replace(tmp, set(self._chunk_named))

    def _write(self, fd: int, text: str | bytes) -> int:
        """Write all of ``text``; returns its size in bytes."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        view = memoryview(data)
        while view:  # one write in practice; a short write is finished, never interleaved
            n = os.write(fd, view)
            view = view[n:]
        self._unsynced = True
        self._written_at = time.monotonic()
        return len(data)

    def _changed(self, events: list[CollectiveEvent], first: int, stuck: set[int], boundary: bool) -> list[CollectiveEvent]:
        """Events written before that changed since (a new object in the trace: its time, its
        error) or whose in-flight flag is now wrong. Only the events that can still change are
        looked at: the last few written, the flagged ones, and, under timing, those written
        without their time until the step ends (asynchronous times arrive at the boundary)."""
        again = []
        timing = self.mode.trace.metadata.get("timing", "off") != "off"
        recent = self._next - RECENT
        for index in stuck:
            if index not in self._watch and index < self._next:  # stuck long after it was written
                pos = index - first
                if 0 <= pos < len(events):
                    self._watch[index] = (None, False)
        for index, (seen, flagged) in list(self._watch.items()):
            pos = index - first
            current = events[pos] if 0 <= pos < len(events) else None
            if current is None:
                del self._watch[index]
                continue
            if current is not seen or (index in stuck) != flagged:
                again.append(current)
            elif not flagged and index < recent and (boundary or not (timing and current.latency_s is None)):
                del self._watch[index]
        again.sort(key=lambda e: e.index)
        return again

    def _as_written(self, e: CollectiveEvent, stuck: set[int]) -> CollectiveEvent:
        flagged = e.index in stuck
        self._watch[e.index] = (e, flagged)
        if len(self._watch) > WATCH_MOST:
            self._watch.pop(next(iter(self._watch)))
        return e._replace(in_flight=True) if flagged and not e.in_flight else e

    def _fold(self, step: int, meta: dict[str, Any]) -> None:
        """Fold what falls out of the kept window into totals; rewrite the file when it holds
        twice the window (keep_steps)."""
        keep = self.keep_steps
        if keep is None:
            most = self.mode.trace.max_events
            if most is not None and len(self.kept) > most:  # mirror the recorder's own window
                for index in list(self.kept)[: len(self.kept) - most]:
                    self.older.add(self.kept.pop(index))
            return
        cutoff = step - keep
        detail = set(meta.get("detail_steps") or ())
        for index, e in list(self.kept.items()):
            if e.step >= cutoff:
                break  # in index order, steps never go back
            if e.step not in detail:
                self.older.add(self.kept.pop(index))
        if cutoff - self._disk_from_step >= keep:
            self._rewrite(meta, cutoff)

    def _rewrite(self, meta: dict[str, Any], cutoff: int) -> None:
        """The file anew: header, totals of older steps, the kept events, and the issued lines
        no chunk holds yet; atomically."""
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        kept = list(self.kept.values())
        text = (header_line(json.loads(json.dumps(meta, default=str)), SCHEMA_VERSION, time.time())
                + older_line(self.older, cutoff)
                + chunk_line(kept, time=time.time(), step=self.step, events_total=self.mode.trace.events_total,
                             metadata=json.loads(self._meta_text) if self._meta_text else None, progress=self.last_progress,
                             in_flight=self.in_flight))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._write(fd, text)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._chunk_named = {e.group.name for e in kept}
        self._replace(tmp, set(self._chunk_named))
        self._disk_from_step = cutoff
        self._unsynced = False

    def _sync_and_beat(self) -> None:
        """fsync at a bounded rate; touch the file when idle, so `watch` sees the rank is alive."""
        with self._lock:
            if self._fd is None:
                return
            now = time.monotonic()
            if self._unsynced and now - self._synced_at >= self.fsync_s:
                os.fsync(self._fd)
                self._unsynced = False
                self._synced_at = now
            elif now - self._written_at >= 2 * self.interval and self.path is not None:
                os.utime(self.path)

    # ---- the end ------------------------------------------------------------------------------

    def final(self) -> tuple[list[CollectiveEvent] | None, Aggregates | None]:
        """After a last flush: the events the final dump keeps one by one and the totals of the
        others; (None, totals) when the dump keeps the recorder's own events (no keep_steps)."""
        self.stop()
        try:
            self.flush()
        except Exception:
            pass
        trace = self.mode.trace
        current = {e.index: e for e in trace.events}
        with self._lock:
            if self.keep_steps is None:
                first = trace.events[0].index if trace.events else trace.events_total
                for index in [i for i in self.kept if i < first]:
                    self.older.add(self.kept.pop(index))
                return None, (self.older if self.older.events else None)
            events = [current.get(i, e) for i, e in self.kept.items()]
            return events, self.older
