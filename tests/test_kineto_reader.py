"""Reading a torch.profiler trace: the C pass over its bytes (commdebug/formats/_kineto.c) keeps
what the full parse keeps, to the bit, on every trace under tests/data/kineto/ and on traces
written every odd way (one line, escapes, names that are no strings, launches with odd fields,
numbers of every form, duplicate keys, NaN, bad JSON, a cut-short file); and neither drops an
event the profiler reader uses (any spelling of a collective, GPU activities, steps, the spans
that tell a phase). The C module is optional at install; here it must be built, or the comparison
compares nothing.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

import commdebug.formats.kineto as kineto_module
from commdebug.errors import DumpError
from commdebug.formats.kineto import KinetoEvents, read_events
from commdebug.formats.profiler import profile_view, read_profile

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted((ROOT / "tests" / "data" / "kineto").rglob("*.json.gz"))
# the names a profiler trace spells a collective call, a step or a phase span with (the events
# the profiler reader reads): each must survive the reading, in any trace
SPELLINGS = ("record_param_comms", "nccl:", "gloo:", "c10d::", "_c10d_functional::", "c10d_functional::",
             "ProfilerStep#", "Optimizer.step#", "autograd::engine::evaluate_function", "FSDP::")


@pytest.fixture
def python_only(monkeypatch):
    """The reader without its C module, as an install without a C compiler runs it."""
    monkeypatch.setattr(kineto_module, "_kineto", None)


def _read(raw: bytes, native: bool, monkeypatch) -> KinetoEvents | str:
    """read_events with or without the C pass: the events, or the error's message."""
    with monkeypatch.context() as m:
        if not native:
            m.setattr(kineto_module, "_kineto", None)
        try:
            return read_events(raw, Path("rank0.json"))
        except DumpError as e:
            return str(e)


def _fields(found: KinetoEvents | str) -> object:
    if isinstance(found, str):
        return found
    return (found.header, found.gpu, found.cpu, found.launches, found.thread_names)


def _same_both_ways(raw: bytes, monkeypatch) -> KinetoEvents | str:
    """The C pass and the full parse give the same events (repr: -0.0 and 0.0, 1 and 1.0 differ),
    or the same error."""
    native, python = _read(raw, True, monkeypatch), _read(raw, False, monkeypatch)
    assert repr(_fields(native)) == repr(_fields(python))
    return native


def test_the_c_module_is_built():
    assert kineto_module._kineto is not None, \
        "commdebug.formats._kineto was not built: pip install -e . (or python setup.py build_ext --inplace) with a C compiler"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_every_trace_reads_the_same_with_and_without_the_c_pass(trace, monkeypatch):
    raw = gzip.decompress(trace.read_bytes())
    assert kineto_module._kineto.scan(raw, kineto_module._MARKERS) is not None  # the fast path, not its fallback
    found = _same_both_ways(raw, monkeypatch)
    assert isinstance(found, KinetoEvents) and found.gpu and found.launches and found.header["distributedInfo"]
    # the profile made of them too: every call, every activity, the overlap figures
    with monkeypatch.context() as m:
        native = profile_view(read_profile(raw, trace, lambda: None))
        m.setattr(kineto_module, "_kineto", None)
        python = profile_view(read_profile(raw, trace, lambda: None))
    assert native.events == python.events and native.notes == python.notes
    for kind in ("comm", "compute"):
        a, b = getattr(native.profile, kind), getattr(python.profile, kind)
        assert [x.tobytes() for x in (a.start, a.end, a.launch, a.ref)] == [x.tobytes() for x in (b.start, b.end, b.launch, b.ref)]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_no_event_the_profiler_reader_uses_is_left_out(trace):
    """Against the trace parsed whole with json: every GPU activity, every launch and every event
    spelled as a collective, a step or a phase span is kept, whatever its category."""
    raw = gzip.decompress(trace.read_bytes())
    events = json.loads(raw)["traceEvents"]
    found = read_events(raw, trace)
    kept = {json.dumps(e, sort_keys=True) for e in found.cpu + found.gpu}
    wanted = [e for e in events if e.get("ph") == "X" and ("stream" in e.get("args", {})
                                                         or any(s in str(e.get("name")) for s in SPELLINGS))]
    spelled = [e for e in wanted if "stream" not in e.get("args", {})]
    assert spelled and len(wanted) > len(spelled)  # both kinds are there to lose
    assert [e for e in wanted if json.dumps(e, sort_keys=True) not in kept] == []
    launches = {e["args"]["correlation"]: (float(e["ts"]), e["tid"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    assert launches and found.launches == launches


# ---- traces written every odd way --------------------------------------------------------------

def _kernel(i: int, **extra: object) -> dict:
    return {"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_AllReduce_{i}", "pid": 0, "tid": 7, "ts": 1000.5 + i,
            "dur": 2.25, "args": {"External id": i, "stream": 7, "correlation": 500 + i, "grid": [1, 2, 3], **extra}}


def _launch(i: int, **fields: object) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 11, "ts": 999.125 + i, "dur": 1,
            "args": {"External id": i, "cbid": 211, "correlation": 500 + i}, **fields}


def _cpu(name: object, **extra: object) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 11, "ts": 990, "dur": 30, "args": {"Seq": 1, **extra}}


def _trace(events: list, indent: int | None = 2, **head: object) -> bytes:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, **head, "traceEvents": events}
    return json.dumps(doc, indent=indent, ensure_ascii=False).encode("utf-8", "surrogatepass")  # lone surrogates as json reads them


BASE = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 11, "args": {"name": "main"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 12, "args": ["not", "a", "dict"]},
        _cpu("ProfilerStep#3"), _cpu("aten::mm"), _cpu("record_param_comms", **{"Collective name": "allreduce"}),
        _cpu("nccl:_all_gather_base"), _cpu("c10d::_allgather_base_"), _launch(0), _kernel(0), _launch(1), _kernel(1),
        {"ph": "s", "id": 1, "cat": "ac2g", "name": "ac2g", "ts": 5}, {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD",
                                                                      "ts": 3, "dur": 1, "args": {"stream": 9}}]


@pytest.mark.parametrize("indent", [None, 0, 2, 4], ids=["one-line", "flat", "kineto", "wide"])
def test_any_layout_reads_the_same(indent, monkeypatch):
    found = _same_both_ways(_trace(BASE, indent), monkeypatch)
    assert [e["name"] for e in found.cpu] == ["ProfilerStep#3", "record_param_comms", "nccl:_all_gather_base", "c10d::_allgather_base_"]
    assert len(found.gpu) == 3 and found.launches == {500: (999.125, 11), 501: (1000.125, 11)}
    assert found.thread_names == {11: "main", 12: ""}


ODD_EVENTS = {
    "escaped and unicode names": [_cpu("nccl:all_reduce \"quoted\" \\ é \U0001F600 \t"), _cpu("n\u0063cl:all_reduce"),
                                  _kernel(2, note="\ud800 alone")],
    "names that are no strings": [_cpu(None), _cpu(42), _cpu(["c10d::allreduce_"]), _cpu({"x": "gloo:"}), _cpu(True),
                                  {"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1}],
    "odd launches": [_launch(2, ts="999"), _launch(3, tid="thread 3"), _launch(4, tid=None), _launch(5, ts=12)],
    "launch with a float correlation": [{**_launch(6), "args": {"correlation": 506.0}}],
    "launch with no time": [{k: v for k, v in _launch(7).items() if k != "ts"}],
    "launches sharing a correlation": [_launch(8), {**_launch(8), "ts": 5.5}],
    "runtime calls without a correlation": [{**_launch(9), "args": {"cbid": 1}}, {**_launch(10), "args": [1, 2]}],
    "numbers of every form": [_kernel(3, a=1e22, b=-0.0, c=123456789012345678901234567890, d=0.1 + 0.2, e=5e-324, f=-17,
                                        g=1.7976931348623157e308, h=4458676522690.655, k=[2.5e-5, 1e100, -1e-100],
                                        m=2**64 - 1, n=-2**63, o=2**63, p=-2**63 - 1, q=-0, r=10**19)],
    "not an event": [1, "two", [3], None],
    "ph that is no string": [{**_kernel(4), "ph": 7}, {**_cpu("nccl:x"), "ph": None}],
    "args that are no dict": [{**_kernel(5), "args": [1, 2]}, {**_cpu("nccl:y"), "args": "z"}],
}


@pytest.mark.parametrize("case", sorted(ODD_EVENTS))
def test_odd_events_read_the_same(case, monkeypatch):
    for indent in (None, 2):
        found = _same_both_ways(_trace(BASE + ODD_EVENTS[case], indent), monkeypatch)
        assert isinstance(found, KinetoEvents) and len(found.gpu) >= 3


ODD_DOCUMENTS = {
    # strings the C pass leaves to the full parse, or reads itself: the same result either way
    "escaped key": b'{"traceEvents": [{"p\\u0068": "X", "cat": "kernel", "args": {"stream": 1}, "ts": 1, "dur": 1}]}',
    "escaped args key": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "args": {"str\\u0065am": 1}, "ts": 1, "dur": 1}]}',
    "escaped category": b'{"traceEvents": [{"ph": "X", "cat": "cuda_runti\\u006de", "name": "x", "args": {"stream": 1, "correlation": 1}}]}',
    "escaped ph": b'{"traceEvents": [{"ph": "\\u0058", "cat": "kernel", "args": {"stream": 1}, "ts": 1, "dur": 1}]}',
    "duplicate keys": b'{"traceEvents": [{"ph": "M", "ph": "X", "cat": "kernel", "args": {"x": 1}, "args": {"stream": 2},'
                      b' "ts": 1, "ts": 2, "dur": 1}], "a": 1, "a": 2}',
    "NaN in a skipped event": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": NaN},'
                              b' {"ph": "X", "cat": "kernel", "args": {"stream": 1}, "ts": 1, "dur": 1}]}',
    "encoded surrogate": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\xed\xa0\x80", "args": {"stream": 1}, "ts": 1}]}',
    "deep nesting": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "args": {"stream": 1, "x": ' + b"[" * 300 + b"]" * 300 + b'}}]}',
    "an escape inside a marker": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "n\\u0063cl:all_reduce", "ts": 1},'
                                 b' {"ph": "X", "cat": "kernel", "args": {"stream": 1}, "ts": 1, "dur": 1}]}',
    "stream only in a name": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "\\"stream\\"", "ts": 1, "dur": 1}]}',
    "no GPU activity": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, "args": {}}]}',
    "empty events": b'{"traceEvents": []}',
    "white space around": b' \r\n\t{"traceEvents": [{"ph": "X", "cat": "kernel", "args": {"stream": 1}, "ts": 1}]} \n',
    # no JSON, or no trace: the same error, from the full parse
    "cut short": _trace(BASE)[:-200],
    "trailing comma": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1,}, ' + json.dumps(_kernel(0)).encode() + b"]}",
    "bad literal in a skipped event": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "x": tru}, ' + json.dumps(_kernel(0)).encode() + b"]}",
    "bad number in a skipped event": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "x": 01}, ' + json.dumps(_kernel(0)).encode() + b"]}",
    "bad escape in a skipped event": b'{"traceEvents": [{"ph": "X", "name": "a\\qb"}, ' + json.dumps(_kernel(0)).encode() + b"]}",
    "raw newline in a string": b'{"traceEvents": [{"ph": "X", "name": "a\nb"}, ' + json.dumps(_kernel(0)).encode() + b"]}",
    "bad UTF-8 in a skipped event": b'{"traceEvents": [{"ph": "X", "name": "\xff"}, ' + json.dumps(_kernel(0)).encode() + b"]}",
    "more after the document": _trace(BASE) + b" x",
    "two documents": _trace(BASE) + _trace(BASE),
    "events not an array": b'{"traceEvents": {"ph": "X"}, "stream": 1}',
    "no events": b'{"stream": 1, "traceEvents_": []}',
    "events twice": b'{"traceEvents": [], "traceEvents": [' + json.dumps(_kernel(0)).encode() + b"]}",
    "a NUL byte": _trace(BASE).replace(b'"aten::mm"', b'"aten\x00mm"'),
}


@pytest.mark.parametrize("case", sorted(ODD_DOCUMENTS))
def test_odd_documents_read_the_same_or_fail_the_same(case, monkeypatch):
    found = _same_both_ways(ODD_DOCUMENTS[case], monkeypatch)
    if case in ("cut short", "trailing comma", "bad literal in a skipped event", "bad number in a skipped event",
                "bad escape in a skipped event", "raw newline in a string", "bad UTF-8 in a skipped event",
                "more after the document", "two documents", "a NUL byte"):
        assert isinstance(found, str) and "not a complete torch.profiler trace" in found, found
    elif case in ("events not an array", "no events"):
        assert isinstance(found, str) and "no 'traceEvents' array" in found, found
    else:
        assert isinstance(found, KinetoEvents), found
    if case == "an escape inside a marker":
        assert [e["name"] for e in found.cpu] == ["nccl:all_reduce"]


def test_random_traces_read_the_same(monkeypatch):
    """Seeded random events: values of every JSON kind at every place the reader looks."""
    rng = random.Random(47)
    words = ["nccl:all_reduce", "gloo:broadcast", "c10d::barrier", "aten::add", "ProfilerStep#2", "FSDP::pre_forward",
             "kernel", "cuda_runtime", "cuda_driver", "cpu_op", "X", "M", "thread_name", "é\u00e9", "a\"b\\c", "\ud83d\ude00"]

    def value(depth: int = 0) -> object:
        kinds = [lambda: None, lambda: True, lambda: rng.randrange(-10**20, 10**20),
                 lambda: rng.uniform(-1e16, 1e16) * 10 ** rng.randrange(-300, 290), lambda: rng.choice(words),
                 lambda: float(rng.randrange(10**6)) / 1000, lambda: rng.randrange(1000),
                 lambda: [value(depth + 1) for _ in range(rng.randrange(3))], lambda: {rng.choice(words): value(depth + 1)}]
        return kinds[rng.randrange(len(kinds) if depth < 3 else 7)]()

    def event() -> dict:
        e = {k: (rng.choice(words) if rng.random() < 0.7 else value()) for k in ("ph", "cat", "name") if rng.random() < 0.9}
        e.update({k: (rng.randrange(1000) if rng.random() < 0.8 else value()) for k in ("tid", "ts") if rng.random() < 0.9})
        args = {rng.choice(words): value() for _ in range(rng.randrange(3))}
        if rng.random() < 0.4:
            args["stream"] = value()
        if rng.random() < 0.5:
            args["correlation"] = rng.randrange(50) if rng.random() < 0.9 else value()
        e["args"] = args if rng.random() < 0.95 else value()
        return e

    for _ in range(40):
        events = [event() for _ in range(60)] + [_kernel(0)]
        _same_both_ways(_trace(events, rng.choice([None, 1])), monkeypatch)


def test_the_python_reader_alone_reads_a_trace(python_only):
    """Without the C module (an install without a compiler) the reader parses the whole trace."""
    raw = gzip.decompress(TRACES[0].read_bytes())
    found = read_events(raw, TRACES[0])
    assert found.gpu and found.cpu and found.launches and kineto_module._kineto is None
