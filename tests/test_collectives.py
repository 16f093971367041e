"""Every collective is recorded with nccl-tests' message size S and bus-bandwidth factor."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import Shard, distribute_tensor

from commdebug import CommDebugMode

N = 8  # world size of the fake world
T = 4 * 8 * 4  # bytes of the 4x8 float32 tensor below


def _t():
    return torch.ones(4, 8)


def _chunks():
    return [torch.ones(1, 8) for _ in range(N)]


# name -> (call, op, reference key, S, busbw factor)
CASES = {
    "all_reduce": (lambda: dist.all_reduce(_t()), "all_reduce", "c10d.allreduce_", T, 2 * (N - 1) / N),
    "all_reduce_coalesced": (lambda: dist.all_reduce_coalesced([_t(), _t()]), "all_reduce", "c10d.allreduce_coalesced_", 2 * T, 2 * (N - 1) / N),
    "broadcast": (lambda: dist.broadcast(_t(), 0), "broadcast", "c10d.broadcast_", T, 1.0),
    "reduce": (lambda: dist.reduce(_t(), 0), "reduce", "c10d.reduce_", T, 1.0),
    "all_gather": (lambda: dist.all_gather([_t() for _ in range(N)], _t()), "all_gather", "c10d.allgather_", N * T, (N - 1) / N),
    "all_gather_into_tensor": (lambda: dist.all_gather_into_tensor(torch.empty(4 * N, 8), _t()), "all_gather", "c10d._allgather_base_", N * T, (N - 1) / N),
    "reduce_scatter": (lambda: dist.reduce_scatter(_t(), [_t() for _ in range(N)]), "reduce_scatter", "c10d.reduce_scatter_", N * T, (N - 1) / N),
    "reduce_scatter_tensor": (lambda: dist.reduce_scatter_tensor(torch.empty(1, 8), torch.ones(N, 8)), "reduce_scatter", "c10d._reduce_scatter_base_", N * 32, (N - 1) / N),
    "all_to_all": (lambda: dist.all_to_all(_chunks(), _chunks()), "all_to_all", "c10d.alltoall_", N * 32, (N - 1) / N),
    "all_to_all_single": (lambda: dist.all_to_all_single(torch.empty(N, 8), torch.ones(N, 8)), "all_to_all", "c10d.alltoall_base_", N * 32, (N - 1) / N),
    "gather": (lambda: dist.gather(_t(), [_t() for _ in range(N)], dst=0), "gather", "c10d.gather_", N * T, (N - 1) / N),
    "scatter": (lambda: dist.scatter(_t(), [_t() for _ in range(N)], src=0), "scatter", "c10d.scatter_", N * T, (N - 1) / N),
    "barrier": (lambda: dist.barrier(), "barrier", "c10d.barrier", 0, 0.0),
    "send": (lambda: dist.send(_t(), 1), "send", "c10d.send", T, 1.0),
    "recv": (lambda: dist.recv(_t(), 1), "recv", "c10d.recv_", T, 1.0),
    "funcol.all_reduce": (lambda: funcol.all_reduce(_t(), "sum", dist.group.WORLD).wait(), "all_reduce", "c10d_functional.all_reduce", T, 2 * (N - 1) / N),
    "funcol.all_reduce_inplace": (
        lambda: torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce_(_t(), "sum", "0")),
        "all_reduce", "c10d_functional.all_reduce", T, 2 * (N - 1) / N,
    ),
    "funcol.all_reduce_coalesced": (lambda: [t.wait() for t in funcol.all_reduce_coalesced([_t(), _t()], "sum", dist.group.WORLD)], "all_reduce", "c10d_functional.all_reduce_coalesced", 2 * T, 2 * (N - 1) / N),
    "funcol.all_gather_autograd": (lambda: funcol.all_gather_tensor_autograd(_t(), 0, dist.group.WORLD).wait(), "all_gather", "c10d_functional.all_gather_into_tensor", N * T, (N - 1) / N),
    "funcol.all_gather_out": (
        lambda: torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_gather_into_tensor_out(_t(), N, "0", out=torch.empty(4 * N, 8))),
        "all_gather", "c10d_functional.all_gather_into_tensor", N * T, (N - 1) / N,
    ),
    "funcol.reduce_scatter": (lambda: funcol.reduce_scatter_tensor(torch.ones(N, 8), "sum", 0, dist.group.WORLD).wait(), "reduce_scatter", "c10d_functional.reduce_scatter_tensor", N * 32, (N - 1) / N),
    "funcol.all_to_all_single": (lambda: funcol.all_to_all_single(torch.ones(N, 8), None, None, dist.group.WORLD).wait(), "all_to_all", "c10d_functional.all_to_all_single", N * 32, (N - 1) / N),
    "funcol.broadcast": (lambda: funcol.broadcast(_t(), 0, dist.group.WORLD).wait(), "broadcast", "c10d_functional.broadcast", T, 1.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_collective_recorded_with_bytes_and_factor(world, name):
    call, op, key, size, factor = CASES[name]
    comm = CommDebugMode()
    with comm:
        call()
    events = list(comm.trace.events)
    assert [e.op for e in events] == [op]
    (e,) = events
    assert e.key == key
    assert e.size_bytes == size
    assert e.busbw_factor == pytest.approx(factor)
    assert (e.group_name, e.group_size, e.group_ranks) == ("0", N, tuple(range(N)))
    assert e.dtype == (None if op == "barrier" else "float32")
    assert comm.get_total_counts() == 1
    assert str(next(iter(comm.get_comm_counts()))) == key


def test_batch_isend_irecv_records_each_p2p_op(world):
    comm = CommDebugMode()
    with comm:
        ops = [dist.P2POp(dist.isend, _t(), 1), dist.P2POp(dist.irecv, _t(), N - 1)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    assert [(e.op, e.size_bytes) for e in comm.trace.events] == [("send", T), ("recv", T)]


def test_unknown_c10d_op_is_counted_under_its_own_name():
    from commdebug import ops

    class FakePacket:
        def __str__(self):
            return "c10d.some_future_collective_"

    spec = ops.lookup(FakePacket())
    assert spec is not None and spec.compat_key == "c10d.some_future_collective_"
    assert ops.lookup(torch.ops.aten.mm) is None
    assert ops.lookup(torch.ops.c10d.check_for_nan) is None


def _every_name() -> set[str]:
    from commdebug import ops

    return set(ops.canonical_names()).union(*(ops.aliases(source) for source in ops.ALIAS_SOURCES))


def test_every_alias_and_shape_rule_belongs_to_a_known_op():
    from commdebug import ops

    known = ops.canonical_names()
    assert {op for op in known if ops.op_info(op) is not None} == known  # one per-op row per op
    for source in ops.ALIAS_SOURCES:
        for name, op in ops.aliases(source).items():
            assert op in known, (source, name, op)
            assert ops.canonical_op(name, source) == op
            assert ops.canonical_op(name) == (name if name in known else None)
    ruled = {op for op in known if ops.shape_rule(op) is not None}
    assert ruled == {"all_gather", "reduce_scatter", "all_to_all"}
    with pytest.raises(ValueError, match="unknown alias source 'nccl'"):
        ops.aliases("nccl")  # type: ignore[arg-type]


def test_ops_option_takes_exactly_the_registrys_torch_names():
    from commdebug import ops
    from commdebug.capture.config import ConfigError, canonical_ops

    accepted = ops.accepted_names("torch")
    for name in accepted:
        assert canonical_ops([f" {name} "]) == {ops.canonical_op(name, "torch")}
    for name in sorted(_every_name() - accepted):
        with pytest.raises(ConfigError, match=f"ops: unknown collective '{name}'") as err:
            canonical_ops([name])
        listed = str(err.value).split("(known: ", 1)[1].rstrip(")").split(", ")
        assert listed == sorted(accepted)


def test_flight_recorder_reader_translates_exactly_the_registrys_names(tmp_path):
    from commdebug import ops
    from commdebug.formats.flight_recorder import from_flight_recorder

    names = sorted(_every_name())
    entry = {"process_group": ("0", "default_pg"), "collective_seq_id": 1, "input_sizes": [[4]], "input_dtypes": ["Float"],
             "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "completed"}
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}, "pg_status": {},
            "entries": [dict(entry, profiling_name=f"nccl:{name}") for name in names]}
    view = from_flight_recorder(dump, tmp_path / "fr_trace_0", 0)
    fr = ops.aliases("flight_recorder")
    # a name Flight Recorder is not listed as writing is kept as it is
    assert [e.op for e in view.events] == [fr.get(name, name) for name in names]


def test_calibrate_takes_exactly_the_registrys_nccl_tests_names(tmp_path):
    from commdebug import ops
    from commdebug.errors import CommDebugError
    from commdebug.estimate.calibrate import parse_nccl_tests

    def output(test: str) -> str:
        ranks = "".join(f"#  Rank {r} Group 0 Pid 1 on node0 device {r} [0x0{r}] GPU\n" for r in range(2))
        row = "10.0 0.1 0.1 0"
        return f"# Collective test starting: {test}_perf\n{ranks}  1024  256  float  sum  -1  {row}  {row}\n"

    path = tmp_path / "out.txt"
    tests = ops.aliases("nccl_tests")
    for name, op in tests.items():
        path.write_text(output(name))
        run = parse_nccl_tests(path)
        assert (run.op, run.factor) == (op, ops.spec_for_op(op).factor)
    # calibrate finds a test's name within longer names (all_reduce in all_reduce_perf_2n)
    for name in sorted(n for n in _every_name() | {"hypercube"} if not any(t in n for t in tests)):
        path.write_text(output(name))
        with pytest.raises(CommDebugError, match="cannot tell which collective"):
            parse_nccl_tests(path)


def test_sub_group_size_and_ranks_drive_the_factor(world):
    group = dist.new_group([0, 2, 4, 6])
    comm = CommDebugMode()
    with comm:
        funcol.all_reduce(_t(), "sum", group).wait()
    (e,) = comm.trace.events
    assert e.group_size == 4 and e.group_ranks == (0, 2, 4, 6)
    assert e.busbw_factor == pytest.approx(2 * 3 / 4)


@pytest.fixture(params=["interpreter frames", "frame objects"])
def source_walk(request, monkeypatch):
    """Each way of finding the user's frame: commdebug.capture._frames (built at install on CPython
    3.11, the version CI runs) and the frame objects it falls back to."""
    from commdebug.capture import source

    if request.param == "frame objects":
        monkeypatch.setattr(source, "_first_other", None)
    elif sys.version_info[:2] == (3, 11):
        assert source._first_other is not None, "commdebug.capture._frames was not built: pip install -e . with a C compiler"
    else:
        pytest.skip("commdebug.capture._frames reads CPython 3.11's frames only")
    return request.param


def test_dtensor_redistribute_and_op_lowering(mesh, source_walk):
    a = distribute_tensor(torch.ones(16, 16), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(16, 16), mesh, [Shard(0)])
    comm = CommDebugMode()
    with comm:
        # DTensor's fused shard-dim all-to-all (on CPU redistribute falls back to all_gather)
        torch.ops._dtensor.shard_dim_alltoall(torch.ones(2, 16), 0, 1, "0")
        a.redistribute(mesh, [Shard(1)])
        _ = a @ b  # mm needs b replicated: lowered to an all_gather inside DTensor's dispatch
    fused, first, second = comm.trace.events
    assert (fused.op, fused.key, fused.size_bytes) == ("all_to_all", "_dtensor.shard_dim_alltoall", 2 * 16 * 4)
    assert first.op == "all_gather"
    assert first.dtensor_op is None  # an explicit redistribute, not an op
    assert second.op == "all_gather"
    assert second.dtensor_op == "aten.mm.default"
    assert second.placements == "[(Shard(dim=0),), (Shard(dim=0),)]"
    assert "DeviceMesh" in second.mesh
    assert second.size_bytes == 16 * 16 * 4


@pytest.mark.parametrize("light", [False, True])
def test_event_fields_module_phase_source_and_seq(tp_transformer, source_walk, light):
    model, tokens = tp_transformer()
    comm = CommDebugMode(light=light)
    with comm:
        for _ in range(2):
            model(tokens).sum().backward()  # the source line events point at
            comm.step()
    events = list(comm.trace.events)
    here = __file__
    assert all(e.source and e.source.startswith(here + ":") for e in events)
    line = int(events[0].source.rsplit(":", 1)[1])
    assert "model(tokens).sum().backward()" in open(here).read().splitlines()[line - 1]
    assert [e.seq for e in events] == list(range(len(events)))  # one group: 0, 1, 2, ...
    assert [e.index for e in events] == list(range(len(events)))
    first = [e for e in events if e.step == 0]
    assert first[0].module == "Transformer.tok_embeddings" and first[0].phase == "forward"
    assert {e.phase for e in first} == {"forward", "backward"}
    assert [(e.module, e.phase, e.op) for e in first] == [(e.module, e.phase, e.op) for e in events if e.step == 1]
    assert comm.trace.steps == 2


def test_source_can_be_turned_off_without_losing_dtensor_ops(tp_transformer, mesh):
    model, tokens = tp_transformer()
    a = distribute_tensor(torch.ones(16, 16), mesh, [Shard(0)])
    comm = CommDebugMode(record_source=False)
    with comm:
        model(tokens)
        _ = a @ a
    assert comm.trace.events and all(e.source is None for e in comm.trace.events)
    assert comm.trace.events[-1].dtensor_op == "aten.mm.default"


def test_max_events_keeps_the_newest_and_counts_drops(world):
    comm = CommDebugMode(max_events=5)
    with comm:
        for _ in range(12):
            dist.all_reduce(_t())
    assert [e.index for e in comm.trace.events] == list(range(7, 12))
    assert comm.trace.events_dropped == 7
    # aggregated counts and bytes are never dropped
    assert comm.get_total_counts() == 12
    assert comm.trace.totals()["bytes"] == 12 * T


def test_bad_max_events_is_a_clear_error():
    with pytest.raises(ValueError, match=r"max_events must be an integer >= 0 or null, got -1"):
        CommDebugMode(max_events=-1)


def test_timing_records_latency_and_bandwidth(world):
    comm = CommDebugMode(timing=True)
    with comm:
        dist.all_reduce(_t())
        funcol.all_reduce(_t(), "sum", dist.group.WORLD).wait()
    for e in comm.trace.events:
        assert e.latency_s is not None and e.latency_s > 0
        assert e.algbw_gbps == pytest.approx(e.size_bytes / e.latency_s / 1e9)
        assert e.busbw_gbps == pytest.approx(e.algbw_gbps * e.busbw_factor)
    untimed = CommDebugMode()
    with untimed:
        dist.all_reduce(_t())
    assert untimed.trace.events[0].latency_s is None
