"""Text table, log file, JSON dump and loading: what a user reads and what lands on disk."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode as ReferenceMode

import commdebug
from commdebug import CommDebugMode, DumpError
from commdebug.model.dump import to_dump_dict
from commdebug.render.table import render_table

from conftest import plain_counts

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def traced(world):
    from commdebug.demo import ModelConfig, tensor_parallel_transformer

    model = tensor_parallel_transformer(ModelConfig(n_layers=2, checkpoint_layers=True), world)
    tokens = torch.randint(0, 256, (4, 16))
    comm = CommDebugMode()
    with comm:
        for _ in range(2):
            model(tokens).sum().backward()
            comm.step()
    return comm


def test_noise_levels_add_information_in_order(traced):
    tables = [traced.generate_comm_debug_tracing_table(noise_level=n, color=False) for n in range(4)]
    t0, t1, t2, t3 = tables
    # 0: the module tree with collective counts and bytes, no ops
    assert "Transformer.layers.1.attention.wo\n" in t0
    assert "*c10d_functional.all_reduce: " in t0 and "KiB)" in t0
    assert "**aten" not in t0 and "module type" not in t0
    # 1: module types, parameter placements and DTensor ops (not trivial ones)
    assert "*module type: class 'torch.nn.modules.linear.Linear'" in t1
    assert " *weight: (Shard(dim=0),)" in t1
    assert "**aten.mm.default" in t1 and "sharding: [" in t1
    assert "**aten.native_layer_norm.default" not in t1  # a plain-tensor op
    # 2: all non-trivial ops; 3: trivial ones too
    assert "**aten.native_layer_norm.default" in t2 and "**aten.t.default" not in t2
    assert "**aten.t.default" in t3
    assert len(t0) < len(t1) < len(t2) < len(t3)
    for section in ("FORWARD PASS", "BACKWARD PASS", "ACTIVATION CHECKPOINTING"):
        assert section in t0


def test_table_counts_match_the_trace(traced):
    table = traced.generate_comm_debug_tracing_table(0, color=False)
    lines = table.splitlines()
    start = lines.index("Global")
    assert lines[start + 1].strip() == "FORWARD PASS"
    count = traced.trace.collective_counts("Global", "forward")["c10d_functional.all_reduce"]
    assert lines[start + 2].strip().startswith(f"*c10d_functional.all_reduce: {count} (")


def test_color_only_when_asked_or_on_a_terminal(traced, tmp_path):
    assert "\x1b[1;33m" in traced.generate_comm_debug_tracing_table(0, color=True)
    assert "\x1b[" not in traced.generate_comm_debug_tracing_table(0)  # pytest's stdout is no tty
    path = tmp_path / "logs" / "comm.txt"
    traced.log_comm_debug_tracing_table_to_file(file_name=str(path), noise_level=1)
    text = path.read_text()
    assert "\x1b[" not in text
    assert text == traced.generate_comm_debug_tracing_table(1, color=False)


def test_bad_noise_level_is_a_clear_error(traced):
    with pytest.raises(ValueError, match="noise_level must be 0, 1, 2 or 3"):
        traced.generate_comm_debug_tracing_table(noise_level=7)


def test_json_dump_keeps_the_reference_node_format(traced, tmp_path):
    path = tmp_path / "a" / "b" / "comm.json"  # parent folders are created
    traced.generate_json_dump(file_name=str(path), noise_level=2)
    root = json.loads(path.read_text())
    for key in ("fqn", "module_type", "parameters", "children", "collectives_forward", "collectives_backward", "operations_forward", "operations_backward", "operations_checkpointing"):
        assert key in root
    assert root["fqn"] == "Global" and root["children"][0]["fqn"] == "Transformer"
    # reference keys; backward includes recompute, as in the reference
    fwd = dict(map(tuple, root["collectives_forward"]))
    bwd = dict(map(tuple, root["collectives_backward"]))
    compat = plain_counts(traced.comm_module_counts)["Global"]
    assert fwd == compat["forward"] and bwd == compat["backward"]
    section = root["commdebug"]
    assert section["schema_version"] == 3 and section["noise_level"] == 2
    meta = section["metadata"]
    assert meta["world_size"] == 8 and meta["rank"] == 0 and meta["steps"] == 2
    assert meta["torch_version"] == torch.__version__ and meta["hostname"]
    events = section["events"]  # by column, text in a string table (docs/json-format.md)
    assert events["count"] == traced.get_total_counts() == len(events["columns"]["op"])
    assert section["summary"]["collectives"] == traced.get_total_counts()
    node_bytes = root["commdebug_node"]["bytes"]
    assert sum(node_bytes.values()) == section["summary"]["bytes"] == sum(events["columns"]["size_bytes"])
    strings = events["strings"]
    assert {strings[i] for i in events["columns"]["group"]} == {"0"}  # groups by name; the table once
    assert {strings[i] for i in events["columns"]["op"]} == {"all_reduce", "all_gather"}
    assert section["groups"] == {"0": {"desc": "default_pg", "size": 8, "ranks": list(range(8))}}
    # noise level 2 drops trivial ops from the rows
    def rows(node):
        yield from (r["name"] for k in ("operations_forward", "operations_backward", "operations_checkpointing") for r in node[k])
        for c in node["children"]:
            yield from rows(c)
    names = set(rows(root))
    assert "aten.native_layer_norm.default" in names and "aten.t.default" not in names


def test_load_gives_back_the_live_model(traced, tmp_path):
    path = tmp_path / "comm.json"
    traced.generate_json_dump(file_name=str(path), noise_level=3)
    loaded = commdebug.load(path)
    live = traced.trace
    assert list(loaded.walk()) == list(live.walk())
    for fqn, _ in live.walk():
        assert loaded.modules[fqn].parameters == live.modules[fqn].parameters
        for phase in ("forward", "backward", "checkpoint"):
            assert loaded.collective_stats(fqn, phase) == live.collective_stats(fqn, phase)
            assert loaded.operations(fqn, phase) == live.operations(fqn, phase)
    assert list(loaded.events) == list(live.events)
    assert loaded.steps == live.steps == 2
    for n in range(4):
        assert render_table(loaded, n, color=False) == render_table(live, n, color=False)


def test_load_reads_the_reference_dump(tp_transformer, tmp_path):
    model, tokens = tp_transformer()
    ref = ReferenceMode()
    with ref:
        model(tokens).sum().backward()
    path = tmp_path / "ref.json"
    ref.generate_json_dump(file_name=str(path), noise_level=3)
    loaded = commdebug.load(path)
    assert loaded.metadata["format"] == "torch.distributed.tensor.debug.CommDebugMode"
    ours = CommDebugMode()
    with ours:
        model(tokens).sum().backward()
    for fqn, _ in ours.trace.walk():
        assert loaded.collective_counts(fqn, "forward") == ours.trace.collective_counts(fqn, "forward"), fqn
    # the reference writes one row per call; loading aggregates them to our counts
    mm = [r for r in loaded.operations("Transformer.output", "forward") if r.name == "aten.mm.default"]
    assert mm and mm[0].count == 1
    assert "Transformer.layers.1.feed_forward.w2" in render_table(loaded, 0)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{not json", "not valid JSON (line 1, column 2"),
        ("[1, 2]", "not a CommDebugMode dump"),
        ('{"fqn": "Global", "children": [], "commdebug": {"schema_version": 99}}', "schema version 99 is not supported"),
        ('{"fqn": "Global", "children": [{"nope": 1}]}', "malformed dump"),
    ],
)
def test_load_errors_name_the_file_and_the_problem(tmp_path, content, message):
    path = tmp_path / "dump.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DumpError) as info:
        commdebug.load(path)
    assert str(path) in str(info.value) and message in str(info.value)
    assert "\n" not in str(info.value)


def test_failed_write_keeps_the_earlier_file(traced, tmp_path, monkeypatch):
    path = tmp_path / "comm.json"
    traced.generate_json_dump(file_name=str(path))
    before = path.read_text()

    def explode(*a, **k):
        raise OSError(28, "No space left on device")

    # the new content is fully written to a temp file; the rename over the old file fails
    monkeypatch.setattr(os, "replace", explode)
    with pytest.raises(commdebug.CommDebugError, match="No space left"):
        traced.generate_json_dump(file_name=str(path), noise_level=0)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["comm.json"]  # no temp file left


def test_dump_to_unwritable_place_is_a_clear_error(traced, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(commdebug.CommDebugError, match="cannot write"):
        traced.generate_json_dump(file_name=str(blocker / "comm.json"))


def test_dump_dict_noise_zero_has_no_ops_or_types(traced):
    root = to_dump_dict(traced.trace, 0)
    node = root["children"][0]
    assert node["module_type"] == "" and node["operations_forward"] == [] and node["collectives_forward"]


def test_schema_1_dumps_still_load(tmp_path):
    """A dump as commdebug 0.1 wrote it: events as objects with their group inline, node
    collectives with group sizes, no group table, no optimizer phase."""
    event = {"index": 0, "op": "all_reduce", "key": "c10d.allreduce_", "aten_op": "c10d.allreduce_.default", "step": 0,
             "phase": "forward", "module": "Net.fc", "group": {"name": "0", "size": 4, "ranks": [0, 1, 2, 3]}, "seq": 0,
             "dtype": "float32", "input_shapes": [[8]], "output_shapes": [[8]], "input_bytes": 32, "output_bytes": 32,
             "size_bytes": 32, "busbw_factor": 1.5, "source": "train.py:3", "latency_s": 0.001}
    node = {"collectives": [{"op": "all_reduce", "key": "c10d.allreduce_", "phase": "forward", "group": "0", "group_size": 4, "count": 1, "bytes": 32}],
            "bytes": {"forward": 32, "backward": 0, "checkpoint": 0}, "counts": {"forward": 1, "backward": 0, "checkpoint": 0}}
    fc = {"fqn": "Net.fc", "module_type": "", "parameters": [], "children": [], "collectives_forward": [["c10d.allreduce_", 1]],
          "collectives_backward": [], "operations_forward": [], "operations_backward": [], "operations_checkpointing": [], "commdebug_node": node}
    net = dict(fc, fqn="Net", children=[fc])
    root = dict(fc, fqn="Global", children=[net])
    root["commdebug"] = {"schema_version": 1, "noise_level": 3, "metadata": {"rank": 2, "world_size": 4, "steps": 1},
                         "summary": {}, "events": [event], "events_dropped": 0, "max_events": 100}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(root))
    trace = commdebug.load(path)
    (e,) = trace.events
    assert (e.group.name, e.group.size, e.group.ranks, e.latency_s, e.in_flight) == ("0", 4, (0, 1, 2, 3), 0.001, False)
    assert trace.groups["0"].ranks == (0, 1, 2, 3)
    assert render_table(trace, 0, color=False).splitlines()[2] == "    *c10d.allreduce_: 1 (32 B) on group 0[4]"


def test_malformed_event_columns_are_a_clear_error(traced, tmp_path):
    path = tmp_path / "d.json"
    traced.generate_json_dump(str(path))
    doc = json.loads(path.read_text())
    doc["commdebug"]["events"]["columns"]["op"][0] = -1  # would wrap to the table's last string
    path.write_text(json.dumps(doc))
    with pytest.raises(DumpError, match=r"d\.json: malformed events \(string index -1 is not in the string table\)"):
        commdebug.load(path)
