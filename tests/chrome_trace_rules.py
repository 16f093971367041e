"""The Trace Event Format rules a Chrome trace must follow for Perfetto and chrome://tracing to
show it as intended (the format's own document, "Trace Event Format", Google): required fields
per phase type, microsecond timestamps, complete events properly nested per thread, metadata
events naming processes and threads."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# phase -> fields it must carry
REQUIRED = {
    "X": ("name", "ph", "ts", "dur", "pid", "tid"),
    "i": ("name", "ph", "ts", "pid", "tid", "s"),
    "M": ("name", "ph", "pid", "args"),
}
METADATA_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}


def validate_chrome_trace(doc: Any) -> list[dict[str, Any]]:
    """Assert ``doc`` is a valid JSON-object-format trace; return its events."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "JSON object format with traceEvents"
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    named_threads: set[tuple[int, int]] = set()
    named_processes: set[int] = set()
    spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        ph = e.get("ph")
        assert ph in REQUIRED, f"unexpected phase {ph!r}: {e}"
        missing = [k for k in REQUIRED[ph] if k not in e]
        assert not missing, f"{ph} event without {missing}: {e}"
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if ph == "M":
            assert e["name"] in METADATA_NAMES, e
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        # microseconds: a run of these tests lasts seconds, so nothing lies beyond an hour
        assert e["ts"] < 3600e6, f"timestamp not in microseconds? {e}"
        if ph == "X":
            assert isinstance(e["dur"], (int, float)) and 0 <= e["dur"] < 3600e6, e
            spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        else:
            assert e["s"] in ("g", "p", "t"), e
        assert (e["pid"], e["tid"]) in named_threads, f"thread ({e['pid']}, {e['tid']}) has no thread_name before its events"
        assert e["pid"] in named_processes, f"process {e['pid']} has no process_name"
    # complete events on one thread nest or follow each other, never overlap partly
    for track, items in spans.items():
        stack: list[float] = []
        for start, end in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"overlapping complete events on {track}: ends {stack[-1]} and {end}"
            stack.append(end)
    return events
