"""Others' traces read word for word (docs/overlap.md, docs/summary.md, docs/json-format.md): every
collective a torch.profiler trace holds is counted once under its op, whichever records spell it
(a ``c10d::`` op, an ``nccl:`` annotation, a ``record_param_comms`` without arguments), and a
spelling no op has is counted under its own name; a value the trace does not give is ``?`` in
text, ``null`` in JSON and the Chrome trace, left out of sums and never in a row of true zeros;
the notes say the facts they rest on; a call's phase follows FSDP's backward hooks.

The traces are written here in Kineto's layout, as an older NCCL trace of two ranks (torch writing
``record_param_comms`` without arguments, two process groups in ``distributedInfo``); the
spellings are those of HolisticTraceAnalysis's test traces (``nccl:_all_gather_base`` inside
``c10d::_allgather_base_``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from kineto_synth import MAIN, STREAM_COMM, STREAM_COMPUTE, document, event, launch

from commdebug.formats.readers import load_rank
from commdebug.model.trace import UNKNOWN_GROUP

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {"0": ("default_pg", [0, 1]), "1": ("pair", [0, 1])}  # two groups: a call's group cannot be assumed
STEPS = (5, 6)
PER_STEP = {"all_gather": 1, "all_reduce": 1, "all_to_all": 1, "barrier": 1, "reduce_scatter": 1, "mystery_op": 1}


class _Ids:
    def __init__(self) -> None:
        self.external, self.correlation = 100, 1000

    def next(self) -> tuple[int, int]:
        self.external += 1
        self.correlation += 1
        return self.external, self.correlation


def _call(out: list[str], ids: _Ids, at: float, records: list[tuple[str, str, dict]], kernel: tuple[str, float, float]) -> None:
    """One call's records nested on the main thread, outermost first, each 2 us inside the one
    before; its NCCL kernel launched from inside the innermost."""
    ext = 0
    for depth, (cat, name, args) in enumerate(records):
        ext, _ = ids.next()
        out.append(event("X", cat, name, MAIN, at + 2 * depth, 40 - 4 * depth, {"External id": ext, **args}))
    _, corr = ids.next()
    out.append(launch(MAIN, at + 2 * len(records), ext, corr))
    name, start, dur = kernel
    out.append(event("X", "kernel", name, STREAM_COMM, start, dur, {"External id": ext, "device": 0, "stream": STREAM_COMM,
                                                                   "correlation": corr}, pid=0))


def older_trace(rank: int, groups: dict[str, tuple[str, list[int]]] = GROUPS, skip_gather_at: int | None = None) -> str:
    """Two profiled steps of an older NCCL job (see the module docstring), per step: an all_gather
    (c10d op + bare record_param_comms + nccl:_all_gather_base), an all_reduce of a tensor list
    (no element type: size not known) under an autograd function, an all_to_all known only by its
    annotation, a barrier NCCL runs as an all_reduce, an op no registry row knows, a reduce_scatter
    in FSDP's root_post_backward_callback; a lone record_param_comms (a wait), a kernel launched
    outside any call, and compute under the all_gather. ``skip_gather_at``: a step whose
    all_gather this rank skips."""
    ids, out = _Ids(), []
    rpc = ("cpu_op", "record_param_comms", {})
    for step, base in zip(STEPS, (0.0, 1000.0), strict=True):
        out.append(event("X", "user_annotation", f"ProfilerStep#{step}", MAIN, base, 1000.0, {"External id": ids.next()[0]}))
        if step != skip_gather_at:
            _call(out, ids, base + 10, [("cpu_op", "c10d::_allgather_base_", {"Input Dims": [[4096], [2048]], "Input type": ["float", "float"]}),
                                        rpc, ("user_annotation", "nccl:_all_gather_base", {})],
                  ("ncclKernel_AllGather_RING_LL_Sum_float(ncclWorkElem)", base + 100, 40))
        out.append(event("X", "cpu_op", "autograd::engine::evaluate_function: MmBackward0", MAIN, base + 190, 200,
                         {"External id": ids.next()[0]}))
        _call(out, ids, base + 200, [("cpu_op", "c10d::allreduce_", {"Input Dims": [[[1024]]], "Input type": ["TensorList"]}),
                                     rpc, ("user_annotation", "nccl:all_reduce", {})],
              ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", base + 260, 40))
        _call(out, ids, base + 450, [rpc, ("user_annotation", "nccl:all_to_all", {})],
              ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", base + 490, 30))
        _call(out, ids, base + 550, [("cpu_op", "c10d::barrier", {"Input Dims": [[]], "Input type": [""]}), rpc,
                                     ("user_annotation", "nccl:all_reduce", {})],
              ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", base + 600, 5))
        _call(out, ids, base + 615, [rpc, ("user_annotation", "nccl:mystery_op", {})],
              ("ncclKernel_Mystery(ncclWorkElem)", base + 660, 5))
        out.append(event("X", "user_annotation", "FSDP::root_post_backward_callback", MAIN, base + 700, 100, {"External id": ids.next()[0]}))
        _call(out, ids, base + 710, [("cpu_op", "c10d::_reduce_scatter_base_", {"Input Dims": [[512], [1024]], "Input type": ["float", "float"]}),
                                     rpc, ("user_annotation", "nccl:_reduce_scatter_base", {})],
              ("ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)", base + 760, 30))
        ext, corr = ids.next()
        out.append(event("X", "cpu_op", "record_param_comms", MAIN, base + 850, 5, {"External id": ext}))  # a wait's: names nothing
        out.append(launch(MAIN, base + 900, ext, corr))  # a kernel no call launched
        out.append(event("X", "kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", STREAM_COMM, base + 905, 20,
                         {"External id": ext, "device": 0, "stream": STREAM_COMM, "correlation": corr}, pid=0))
        ext, corr = ids.next()
        out.append(event("X", "cpu_op", "aten::mm", MAIN, base + 80, 3, {"External id": ext}))
        out.append(launch(MAIN, base + 81, ext, corr))
        out.append(event("X", "kernel", "ampere_sgemm_128x64_nn", STREAM_COMPUTE, base + 90, 300,
                         {"External id": ext, "device": 0, "stream": STREAM_COMPUTE, "correlation": corr}, pid=0))
    return document(out, rank, 2, groups)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("older")
    for rank in (0, 1):
        (folder / f"rank{rank}.pt.trace.json").write_text(older_trace(rank))
    return folder


@pytest.fixture
def cli(in_process_cli):
    return in_process_cli  # commdebug ARGS in this process (tests/conftest.py)


def test_every_call_counts_once_under_its_op_whatever_records_spell_it(traces):
    view = load_rank(traces / "rank0.pt.trace.json")
    assert Counter(e.op for e in view.events) == {op: n * len(STEPS) for op, n in PER_STEP.items()}
    # a barrier NCCL runs as an all_reduce is the barrier the program called, and moves nothing
    barriers = [e for e in view.events if e.op == "barrier"]
    assert all(e.size_bytes == 0 for e in barriers)
    gathers = [e for e in view.events if e.op == "all_gather"]
    assert all(e.size_bytes == 4096 * 4 and e.latency_s == pytest.approx(40e-6) for e in gathers)  # its c10d op's shapes, its kernel
    assert all(e.group is UNKNOWN_GROUP for e in view.events)  # two groups listed: none assumed
    notes = "\n".join(view.notes)
    assert "2 collectives under a name no op of commdebug's registry has, counted under that name: nccl:mystery_op (2)" in notes
    assert ("the trace's 14 record_param_comms carry no arguments (as older torch wrote them)" in notes
            and "2 of them lie outside any collective's annotation or op (a wait leaves the same record) and are not counted" in notes), notes
    assert ("12 collectives name no process group (the trace's record_param_comms carry no arguments; distributedInfo lists 2 groups, "
            "so none can be assumed)") in notes, notes
    assert "gloo" not in notes and "torch before 2.1" not in notes  # an NCCL trace: nothing said of gloo
    assert ("6 collectives of unknown size, shown as ? and left out of bytes and bandwidths: 4 with no record that carries sizes "
            "(no c10d op; record_param_comms without arguments); 2 whose c10d op's shapes name no element type (a tensor list)") in notes, notes


def test_phase_follows_the_autograd_engine_and_fsdps_backward_hooks(traces):
    phases = {(e.op, e.phase) for e in load_rank(traces / "rank0.pt.trace.json").events}
    assert ("reduce_scatter", "backward") in phases and ("reduce_scatter", "forward") not in phases  # in root_post_backward_callback
    assert ("all_reduce", "backward") in phases and ("all_gather", "forward") in phases


def test_sizes_not_known_are_question_marks_in_text_and_null_in_json_never_zero(traces, cli):
    text = cli("summary", str(traces / "rank0.pt.trace.json"), "--by", "op,size").stdout
    assert "12 collectives, 40.00 KiB (6 calls of unknown size not in it)" in text, text
    rows = {tuple(line.split()[:2]): line.split() for line in text.splitlines() if line.split()[:1] and line.split()[0] in PER_STEP}
    for op in ("all_to_all", "all_reduce", "mystery_op"):
        assert rows[(op, "?")][2:4] == ["2", "?"], text
        assert rows[(op, "?")][-5:] == ["?"] * 5, text  # timed, but no size: no bandwidth, not 0.00
    assert rows[("barrier", "0")][3:5] == ["2", "0"], text  # the true zeros keep their own row
    assert rows[("all_gather", "16.00")][-4:] == ["?"] * 4, text  # algbw known, busbw not: the group's size is not
    data = json.loads(cli("summary", str(traces / "rank0.pt.trace.json"), "--by", "op,size", "--json").stdout)
    unknown = [r for r in data["rows"] if r["size_bytes"] is None]
    assert {r["op"] for r in unknown} == {"all_reduce", "all_to_all", "mystery_op"}
    assert all(r["bytes"] is None and r["unknown_size_calls"] == r["calls"] == 2 and r["algbw_gbps"] is None for r in unknown)
    assert data["header"]["bytes"] == 40 * 1024 and data["header"]["unknown_size_calls"] == 6
    gather = next(r for r in data["rows"] if r["op"] == "all_gather")
    assert gather["algbw_gbps"] > 0 and gather["busbw_gbps"] is None  # the group's size, its factor depends on, is not known


def test_the_chrome_trace_says_null_and_unknown_never_zero_or_question_mark(traces, tmp_path, cli):
    out = tmp_path / "trace.json"
    assert cli("trace", str(traces / "rank0.pt.trace.json"), "-o", str(out)).returncode == 0
    calls = [e["args"] for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X" and "op" in e.get("args", {})]
    unknown = [a for a in calls if a["op"] in ("all_reduce", "all_to_all", "mystery_op")]
    assert len(unknown) == 6 and all(a["bytes"] is None and a["busbw_gbps"] is None for a in unknown), unknown
    assert all(a["group"] == "unknown" and a["module"] == "unknown" for a in calls)
    assert not any(v in ("?", 0.0) for a in unknown for k, v in a.items() if k in ("bytes", "busbw_gbps", "group", "module"))


def test_report_says_what_it_cannot_pair_and_why(traces, cli):
    text = cli("report", str(traces)).stdout
    ops = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] and line.split()[0] in PER_STEP}
    assert ops["all_to_all"][2] == "?" and ops["all_to_all"][-1] == "?", text  # bytes, straggler: not known
    assert ops["barrier"][-1] == "?", text  # a barrier's calls cannot be paired either: no "0 s"
    assert ("late ranks: none can be told: 24 timed calls name no process group (the traces record none), and a call is "
            "compared across ranks by its group and sequence number") in text, text
    assert "a --ranks selection" not in text and "missing dumps" not in text, text


def test_overlap_names_unattributed_communication_and_unknown_groups_with_words(traces, cli):
    data = json.loads(cli("overlap", str(traces / "rank0.pt.trace.json"), "--json", "--by", "group").stdout)
    rows = {r["group"]: r for r in data["rows"]}
    # the calls of a group the trace does not name are tied to their calls: "unknown", not
    # "unattributed", which is the kernel no call launched
    assert set(rows) == {"unknown", "unattributed"}, data["rows"]
    assert rows["unknown"]["calls"] == 6 and rows["unattributed"]["calls"] == 0
    # in HTA's window (step 5): only the kernel no call launched is unattributed; the kernels of
    # the calls a reader of one spelling drops (nccl:_all_gather_base, nccl:mystery_op) are tied
    assert rows["unattributed"]["comm_s"] == pytest.approx(20e-6)
    text = cli("overlap", str(traces / "rank0.pt.trace.json"), "--by", "group").stdout
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith("0 ")}
    assert set(lines) == {"unknown", "unattributed"} and lines["unknown"].split()[2] == "6", text


def test_a_dump_keeps_unknown_sizes_null_and_reads_them_back(traces, tmp_path, cli):
    from commdebug.formats.readers import read
    from commdebug.model.dump import SCHEMA_VERSION, from_dump_dict, to_dump_dict

    trace = read(traces / "rank0.pt.trace.json")
    data = json.loads(json.dumps(to_dump_dict(trace)))
    assert data["commdebug"]["schema_version"] == SCHEMA_VERSION == 3
    node = data["commdebug_node"]
    assert node["unknown_size"] == {"forward": 4, "backward": 2} and node["bytes"] == {"forward": 32 * 1024, "backward": 8 * 1024, "checkpoint": 0, "optimizer": 0}
    summary = data["commdebug"]["summary"]
    assert summary["unknown_size"] == 6 and summary["bytes"] == 40 * 1024 and summary["by_op"]["all_to_all"]["bytes"] is None
    stats = {(c["op"], c["phase"]): c for c in node["collectives"]}
    assert stats[("all_to_all", "forward")]["bytes"] is None and stats[("all_to_all", "forward")]["unknown_size"] == 2
    back = from_dump_dict(data)
    assert [e.size_bytes for e in back.events] == [e.size_bytes for e in trace.events]
    assert sum(e.size_bytes is None for e in back.events) == 6
    assert back.totals()["bytes"] == 40 * 1024 and back.totals()["unknown_size"] == 6
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(data))
    table = cli("table", str(path)).stdout
    assert "*profiler:all_to_all: 2 (?)" in table and "*profiler:all_gather: 2 (32.00 KiB)" in table, table


def test_a_finding_on_a_call_of_unknown_size_says_so(tmp_path, cli):
    one = {"0": ("default_pg", [0, 1])}  # one group: every call is on it, numbered in trace order
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.pt.trace.json").write_text(older_trace(rank, one, skip_gather_at=6 if rank == 1 else None))
    text = cli("check", str(tmp_path)).stdout
    assert "[mismatch] group default_pg[2] seq 6:" in text, text
    sides = [line.strip() for line in text.splitlines() if line.startswith("     rank")]
    # the side of unknown size says so: not "all_reduce 0 B", not a size left out unsaid
    assert "rank 0: all_gather 16.00 KiB float32" in sides and "rank 1: all_reduce ?" in sides, sides
