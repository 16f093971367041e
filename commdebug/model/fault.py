"""A rank's fault record: how its process died when a fatal signal ended it (docs/ranks.md).

A rank recorded by ``commdebug run`` (or the start-up hook) that dies of SIGSEGV, SIGABRT,
SIGBUS, SIGFPE or SIGILL leaves ``rank<R>.fault`` beside its dump or stream (``pid<P>.fault``
when it died before its rank was known), written by :mod:`commdebug.launch.faults` at the
moment of death: a header naming the process, the signal, then every thread's Python stack in
the standard library's faulthandler format::

    commdebug fault record 1
    rank: 1
    pid: 4242
    run_id: 20261127T101500-1a2b3c4d
    main_thread: 0x00007f23c9413b80
    signal: 6
    thread: 0x00007f23c1ffe6c0

    Current thread 0x00007f23c1ffe6c0 (most recent call first):
      <no Python frame>

    Thread 0x00007f23c9413b80 (most recent call first):
      File "/home/me/job.py", line 40 in train_step
      ...

A record belongs to a rank's dump or stream only when its pid (and run id, where both have one)
is that rank's: a record left by an earlier run in a reused folder is never blamed on this one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAULT_SUFFIX", "FAULT_VERSION", "CAUSE_NOT_RECORDED", "NORMAL_ENDINGS", "SIGNALS", "Frame", "FaultRecord", "header_text",
           "parse_fault", "fault_words", "fault_line", "program_frame", "is_program", "ending_note"]

FAULT_SUFFIX = ".fault"
FAULT_VERSION = 1
_MAGIC = "commdebug fault record"

# what to say of a rank whose process ended without a final dump and without a record: the
# usual causes, none of them named as the cause
# metadata.ended_by of a program that ended as it meant to (os._exit(0): one that leaves past the
# interpreter's teardown, docs/ranks.md); any other ending is a failure
NORMAL_ENDINGS = frozenset({"exit", "sys.exit(0)", "sys.exit(None)", "os._exit(0)", "context exit"})
CAUSE_NOT_RECORDED = ("the cause was not recorded (SIGKILL, the OOM killer, a lost node or a native crash "
                      "are the usual ones)")

# signal number on Linux -> (name, what it means in a sentence)
SIGNALS: dict[int, tuple[str, str]] = {
    4: ("SIGILL", "an illegal instruction"),
    6: ("SIGABRT", "a native abort"),
    7: ("SIGBUS", "a bus error"),
    8: ("SIGFPE", "a floating-point exception"),
    11: ("SIGSEGV", "a segmentation fault"),
}

# frames that are not the program's own: torch, commdebug, the standard library, frozen modules;
# commdebug's from a source tree too, wherever the record was written (another checkout's path)
_LIBRARY = re.compile(r"([/\\](site|dist)-packages[/\\](torch|commdebug)[/\\])|([/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages))|^<"
                      r"|(^|[/\\])commdebug[/\\](capture|launch)[/\\]")
_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # commdebug/, from a source tree too
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class FaultRecord:
    """What a fault record holds, as read."""

    signal: str  # "SIGABRT"; "signal 42" for one without a name here
    signum: int
    pid: int | None
    rank: int | None
    run_id: str | None
    main: list[Frame] = field(default_factory=list)  # the main thread's stack, innermost first
    thread: list[Frame] = field(default_factory=list)  # the thread the signal came in, when not the main one
    in_main: bool = True  # the signal came in the main thread
    torn: bool = False  # the process was killed while writing it

    def to_dict(self) -> dict[str, Any]:
        """The record as a rank's ``metadata.fault`` holds it (readers add ``file``,
        ``after_final_dump`` and ``words``)."""
        return {"signal": self.signal, "signum": self.signum, "pid": self.pid, "rank": self.rank, "run_id": self.run_id,
                "in_main_thread": self.in_main, "torn": self.torn,
                "main": [f.__dict__ for f in self.main], "thread": [f.__dict__ for f in self.thread]}


def header_text(rank: int | None, pid: int, run_id: str | None, main_thread: int) -> str:
    """The lines a record starts with, written before any signal comes (the handler adds the
    signal, its thread and the stacks)."""
    return (f"{_MAGIC} {FAULT_VERSION}\nrank: {'-' if rank is None else rank}\npid: {pid}\n"
            f"run_id: {run_id or '-'}\nmain_thread: 0x{main_thread:016x}\n")


def parse_fault(raw: bytes) -> FaultRecord | None:
    """A record's content, or None when the file holds no fault (empty, not a record, or a
    header without a signal). A record cut short reads up to where it stops (``torn``)."""
    text = raw.decode("utf-8", "replace")
    lines = text.split("\n")
    if not lines or not lines[0].startswith(_MAGIC):
        return None
    head: dict[str, str] = {}
    i = 1
    while i < len(lines) and lines[i].strip():
        key, _, value = lines[i].partition(":")
        head[key.strip()] = value.strip()
        i += 1
    if not head.get("signal", "").isdigit():
        return None
    signum = int(head["signal"])
    stacks: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in lines[i:]:
        m = _THREAD.match(line)
        if m:
            current = stacks.setdefault(int(m.group(2), 16), [])
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            current.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    main_id, thread_id = _hex(head.get("main_thread")), _hex(head.get("thread"))
    record = FaultRecord(SIGNALS.get(signum, (f"signal {signum}", ""))[0], signum, _int(head.get("pid")),
                         _int(head.get("rank")), None if head.get("run_id") in (None, "", "-") else head["run_id"])
    record.main = stacks.get(main_id, []) if main_id is not None else []
    record.in_main = thread_id is None or thread_id == main_id
    if not record.in_main and thread_id is not None:
        record.thread = stacks.get(thread_id, [])
    record.torn = not text.endswith("\n")
    return record


def _hex(value: str | None) -> int | None:
    try:
        return int(value, 16) if value else None
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    return int(value) if value and value.lstrip("-").isdigit() else None


def is_program(frame: dict[str, Any]) -> bool:
    """Whether a frame (``{"file", ...}``) is the program's own code: not torch's, commdebug's,
    the standard library's or a frozen module's."""
    file = str(frame.get("file", ""))
    return not _LIBRARY.search(file) and not file.startswith(_OWN_PACKAGE)


def program_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame (``{"file", "line", "function"}``, innermost first) of the program's
    own code (not torch's, commdebug's or the standard library's), else the innermost frame."""
    return next(filter(is_program, frames), frames[0] if frames else None)


def fault_line(fault: dict[str, Any]) -> str | None:
    """``"/home/me/job.py:40"``: where the main thread was in the program's own code when the
    signal came (a collective's source line reads the same), or None where its stack does not
    reach the program's code."""
    main = next(filter(is_program, fault.get("main") or []), None)
    return None if main is None else f"{main.get('file')}:{main.get('line')}"


def fault_words(fault: dict[str, Any]) -> str:
    """"SIGABRT (a native abort), main thread at job.py:40 in train_step": the signal, what it
    means, where it came when not in the main thread, and where the main thread was (in the
    program's own code where its stack reaches it)."""
    signum = fault.get("signum")
    meaning = SIGNALS.get(signum, ("", ""))[1] if isinstance(signum, int) else ""
    text = str(fault.get("signal", "a fatal signal")) + (f" ({meaning})" if meaning else "")
    if not fault.get("in_main_thread", True):
        other = program_frame(list(fault.get("thread") or []))
        text += (f" in another thread, at {other['file']}:{other['line']} in {other['function']}" if other
                 else " in a thread running no Python code")
    main = program_frame(list(fault.get("main") or []))
    return text + (f", main thread at {main['file']}:{main['line']} in {main['function']}" if main else ", main thread in no Python code")


def ending_note(meta: dict[str, Any], alive: bool | None = None) -> str | None:
    """How a rank's process ended where its dump alone cannot say it, as a note on the rank: a
    fatal signal (after its final dump, or instead of it), or a stream (``metadata.stream``, as
    the readers give it) with no final dump; ``alive``: whether its process still runs, where
    this host can tell (``commdebug check`` says the same)."""
    fault = meta.get("fault")
    if isinstance(fault, dict):
        if fault.get("after_final_dump"):
            return (f"died of {fault_words(fault)} after its final dump was written, after the program's code ended: "
                    "its dump is complete")
        return f"ended by {fault_words(fault)}, without a final dump"
    if isinstance(meta.get("stream"), dict) and meta.get("ended_by") in (None, "hang"):
        if alive is False:
            return f"its process ended without a final dump and {CAUSE_NOT_RECORDED}; only its stream is left"
        if alive:
            return "still running: no final dump yet, only its stream"
        return f"no final dump, only its stream: it still runs, or its process ended and {CAUSE_NOT_RECORDED}"
    return None
