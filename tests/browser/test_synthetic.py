"""The synthetic dumps the browser tests and the benchmark use are dumps commdebug accepts."""

from __future__ import annotations

import json
import re

import pytest

from visualizer import assets

from synthetic import REFERENCE_TRIVIAL_OPS, event_dicts, to_reference, transformer_dump


def test_trivial_ops_are_torchs():
    from torch.distributed.tensor.debug._comm_mode import trivial_ops

    js = assets.js()
    in_js = re.search(r"REFERENCE_TRIVIAL_OPS = \[(.*?)\]", js, re.S).group(1)
    assert set(re.findall(r'"([^"]+)"', in_js)) == set(REFERENCE_TRIVIAL_OPS) == trivial_ops


@pytest.mark.parametrize("make", [transformer_dump, lambda: transformer_dump(schema=1),
                                  lambda: to_reference(transformer_dump(root="tp-model"))],
                         ids=["commdebug", "schema1", "reference"])
def test_commdebug_loads_them(make, tmp_path):
    import commdebug

    path = tmp_path / "dump.json"
    path.write_text(json.dumps(make()))
    commdebug.load(path)


@pytest.mark.parametrize("schema", [1, 2])
def test_counts_nest_and_add_up(walk, schema):
    dump = transformer_dump(layers=3, steps=2, schema=schema)
    cd = dump["commdebug"]
    assert sum(dump["commdebug_node"]["counts"].values()) == cd["summary"]["collectives"] == len(event_dicts(dump))
    assert sum(dump["commdebug_node"]["bytes"].values()) == cd["summary"]["bytes"]
    phases = ("forward", "backward", "checkpoint") + (("optimizer",) if schema == 2 else ())
    assert tuple(dump["commdebug_node"]["counts"]) == phases
    for node in walk(dump):
        mine = node["commdebug_node"]
        for phase in phases:
            assert mine["counts"][phase] >= sum(c["commdebug_node"]["counts"][phase] for c in node["children"])
        # The reference's keys: backward includes checkpoint recompute.
        assert sum(c for _, c in node["collectives_backward"]) == mine["counts"]["backward"] + mine["counts"]["checkpoint"]


def test_schema_2_events_are_commdebugs():
    """The synthetic events are what commdebug's own loader reads back, groups resolved."""
    from commdebug.model.dump import from_dump_dict

    dump = transformer_dump(layers=2, steps=2)
    trace = from_dump_dict(dump)
    assert len(trace.events) == dump["commdebug"]["events"]["count"]
    assert {e.group.label for e in trace.events} == {"mesh_tp[8]"}
    assert {e.phase for e in trace.events} == {"forward", "backward", "checkpoint", "optimizer"}
    assert all(e.start_s is not None and e.latency_s for e in trace.events)
