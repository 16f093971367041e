"""The synthetic dumps the browser tests and the benchmark use are dumps commdebug accepts."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

import visualizer
from visualizer.synthetic import REFERENCE_TRIVIAL_OPS, to_reference, transformer_dump


def test_trivial_ops_are_torchs():
    from torch.distributed.tensor.debug._comm_mode import trivial_ops

    js = (resources.files(visualizer) / "static" / "viewer.js").read_text()
    in_js = re.search(r"REFERENCE_TRIVIAL_OPS = \[(.*?)\]", js, re.S).group(1)
    assert set(re.findall(r'"([^"]+)"', in_js)) == set(REFERENCE_TRIVIAL_OPS) == trivial_ops


@pytest.mark.parametrize("make", [transformer_dump, lambda: to_reference(transformer_dump(root="tp-model"))],
                         ids=["commdebug", "reference"])
def test_commdebug_loads_them(make, tmp_path):
    import commdebug

    path = tmp_path / "dump.json"
    path.write_text(json.dumps(make()))
    commdebug.load(path)


def test_counts_nest_and_add_up(walk):
    dump = transformer_dump(layers=3, steps=2)
    cd = dump["commdebug"]
    assert sum(dump["commdebug_node"]["counts"].values()) == cd["summary"]["collectives"] == len(cd["events"])
    assert sum(dump["commdebug_node"]["bytes"].values()) == cd["summary"]["bytes"]
    for node in walk(dump):
        mine = node["commdebug_node"]
        for phase in ("forward", "backward", "checkpoint"):
            assert mine["counts"][phase] >= sum(c["commdebug_node"]["counts"][phase] for c in node["children"])
        # The reference's keys: backward includes checkpoint recompute.
        assert sum(c for _, c in node["collectives_backward"]) == mine["counts"]["backward"] + mine["counts"]["checkpoint"]
