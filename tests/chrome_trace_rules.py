"""The Trace Event Format rules a Chrome trace must follow for Perfetto and chrome://tracing to
show it as intended (the format's own document, "Trace Event Format", Google): required fields
per phase type, microsecond timestamps, complete events properly nested per thread, metadata
events naming processes and threads, flow events (s, t, f) joined by id, each inside a complete
event of its own thread (they bind to the enclosing slice: ``bp: e``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# phase -> fields it must carry
REQUIRED = {
    "X": ("name", "ph", "ts", "dur", "pid", "tid"),
    "i": ("name", "ph", "ts", "pid", "tid", "s"),
    "M": ("name", "ph", "pid", "args"),
    "s": ("name", "cat", "ph", "ts", "pid", "tid", "id"),
    "t": ("name", "cat", "ph", "ts", "pid", "tid", "id"),
    "f": ("name", "cat", "ph", "ts", "pid", "tid", "id"),
}
FLOW = frozenset("stf")
METADATA_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}


def validate_chrome_trace(doc: Any) -> list[dict[str, Any]]:
    """Assert ``doc`` is a valid JSON-object-format trace; return its events."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "JSON object format with traceEvents"
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    named_threads: set[tuple[int, int]] = set()
    named_processes: set[int] = set()
    spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[tuple[str, str, Any], list[dict[str, Any]]] = defaultdict(list)
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
        elif ph in FLOW:
            flows[(e["cat"], e["name"], e["id"])].append(e)
        else:
            assert e["s"] in ("g", "p", "t"), e
        assert (e["pid"], e["tid"]) in named_threads, f"thread ({e['pid']}, {e['tid']}) has no thread_name before its events"
        assert e["pid"] in named_processes, f"process {e['pid']} has no process_name"
    # complete events on one thread nest or follow each other, never overlap partly
    for track, items in spans.items():
        stack: list[float] = []
        for start, end in sorted(items, key=lambda s: (s[0], -s[1])):
            # timestamps are written to the nanosecond: sums of two of them may miss by 1e-14
            while stack and stack[-1] <= start + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"overlapping complete events on {track}: ends {stack[-1]} and {end}"
            stack.append(end)
    # a flow: one start, one finish, steps between, each point inside a span of its own thread
    for key, points in flows.items():
        phases = sorted(p["ph"] for p in points)
        assert phases.count("s") == 1 and phases.count("f") == 1, f"flow {key} needs one start and one finish: {phases}"
        for p in points:
            assert p.get("bp") == "e" or p["ph"] == "s", f"flow point does not bind to its enclosing slice: {p}"
            assert any(a <= p["ts"] <= b for a, b in spans[(p["pid"], p["tid"])]), f"flow point outside every span of its thread: {p}"
    return events
