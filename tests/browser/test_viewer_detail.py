"""The detail panel: module type, parameters, collectives, and the noise-level switch."""

from __future__ import annotations

from collections import Counter

from synthetic import REFERENCE_TRIVIAL_OPS, transformer_dump

WQ = "Transformer.layers.1.attention.wq"  # checkpointed layer: ops in all three phases
PHASE_LISTS = {"forward": "operations_forward", "backward": "operations_backward",
               "checkpoint": "operations_checkpointing"}


def find(dump, fqn, walk):
    return next(n for n in walk(dump) if n["fqn"] == fqn)


def expected_ops(node, level) -> Counter:
    """(phase, op) -> calls kept at noise `level`, by docs/json-format.md's rules."""
    kept = Counter()
    for phase, key in PHASE_LISTS.items():
        for row in node[key]:
            if level == 0 or (level < 3 and row["name"] in REFERENCE_TRIVIAL_OPS):
                continue
            if level == 1 and not row["input_sharding"]:
                continue
            kept[phase, row["name"]] += row.get("count", 1)
    return kept


def shown_ops(viewer) -> Counter:
    shown = Counter()
    for phase, op, count, *_ in viewer.table("detail-ops"):
        shown[phase, op] += int(count)
    return shown


def set_noise(page, level):
    page.click(f'#noise label:has(input[value="{level}"])')


def test_detail_shows_type_parameters_and_collectives(viewer, dump, walk):
    page = viewer.open(dump)
    viewer.expand_all()
    fqn = "Transformer.layers.0.attention.wo"
    viewer.select(fqn)
    node = find(dump, fqn, walk)
    assert page.text_content("#detail-type") == node["module_type"]
    assert viewer.table("detail-params") == [["weight", "(Shard(dim=1),)"]]
    assert viewer.table("detail-phases") == [["forward", "2", "8.0 KiB"], ["backward", "0", "0 B"],
                                             ["checkpoint", "0", "0 B"], ["optimizer", "0", "0 B"]]
    assert viewer.table("detail-collectives") == [
        [c["phase"], c["op"], str(c["count"]), "8.0 KiB", "mesh_tp[8]"]
        for c in node["commdebug_node"]["collectives"]]


def test_noise_switch_filters_operations(viewer, dump, walk):
    page = viewer.open(dump)
    viewer.expand_all()
    viewer.select(WQ)
    assert page.is_checked('input[name="noise"][value="3"]')  # the dump's level by default
    node = find(dump, WQ, walk)
    for level in (0, 1, 2, 3, 1):
        set_noise(page, level)
        assert shown_ops(viewer) == expected_ops(node, level), level
    set_noise(page, 0)
    assert page.text_content("#ops-section .empty") == "No operations at this level."


def test_noise_levels_differ_on_this_module(dump, walk):
    # Guards the test above: each level must keep a different set of rows here.
    node = find(dump, WQ, walk)
    kept = [expected_ops(node, level) for level in range(4)]
    assert all(sum(kept[i].values()) < sum(kept[i + 1].values()) for i in range(3))
    assert {phase for phase, _ in kept[3]} == {"forward", "backward", "checkpoint"}


def test_switch_keeps_its_level_across_selections(viewer, dump, walk):
    page = viewer.open(dump)
    viewer.expand_all()
    set_noise(page, 1)
    viewer.select("Transformer.output")
    assert shown_ops(viewer) == expected_ops(find(dump, "Transformer.output", walk), 1)


def test_dump_written_at_a_lower_level(viewer, walk):
    dump = transformer_dump(layers=2, steps=1, noise_level=1)
    page = viewer.open(dump)
    viewer.expand_all()
    viewer.select(WQ)
    assert page.is_checked('input[name="noise"][value="1"]')
    level1 = shown_ops(viewer)
    assert level1 == expected_ops(find(dump, WQ, walk), 1) and level1
    set_noise(page, 3)
    assert "written at noise level 1; higher levels show nothing more" in page.text_content("#noise-note")
    assert shown_ops(viewer) == level1


def test_reference_node_detail(viewer, reference_dump):
    page = viewer.open(reference_dump)
    viewer.expand_all()
    fqn = "tp-model.layers.1.attention.wo"
    viewer.select(fqn)
    # The reference's backward includes checkpoint recompute and records no bytes.
    assert viewer.table("detail-phases") == [["forward", "2", "—"], ["backward", "2", "—"], ["checkpoint", "—", "—"],
                                             ["optimizer", "—", "—"]]
    assert viewer.table("detail-collectives") == [
        ["forward", "c10d_functional.all_reduce", "2", "—", "—"],
        ["backward", "c10d_functional.all_reduce", "2", "—", "—"]]
    # Rows repeated once per call are merged back into counts.
    ops = shown_ops(viewer)
    assert ops["forward", "aten.mm.default"] == 2
    assert page.text_content("#noise-note") == "Operations issued in this module itself, identical rows merged."
