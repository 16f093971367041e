"""Pages made from dumps of a real run (see the real_dumps fixture), ours and torch's."""

from __future__ import annotations

from collections import Counter

from playwright.sync_api import expect

from synthetic import event_dicts


def test_commdebug_dump(viewer, real_dumps, walk):
    dump = real_dumps["commdebug"]
    cd = dump["commdebug"]
    page = viewer.open(dump)
    expect(page.locator("#meta-world-size")).to_have_text("8")
    expect(page.locator("#meta-steps")).to_have_text(str(cd["metadata"]["steps"]))
    expect(page.locator("#meta-torch")).to_have_text(cd["metadata"]["torch_version"])
    expect(page.locator("#total-collectives")).to_have_text(str(cd["summary"]["collectives"]))
    chips = page.eval_on_selector_all("#by-op li", "ls => ls.map(l => [l.dataset.op, +l.dataset.count, +l.dataset.bytes])")
    assert sorted(chips) == sorted([op, v["count"], v["bytes"]] for op, v in cd["summary"]["by_op"].items())
    viewer.expand_all()
    cells = viewer.cells()
    for node in walk(dump):
        extra = node["commdebug_node"]
        shown = cells[node["fqn"]]
        assert [shown[p] for p in extra["counts"]] == [str(c) for c in extra["counts"].values()], node["fqn"]
        assert shown["data_bytes"] == str(sum(extra["bytes"].values()))
    expect(page.locator("#events-count")).to_have_text(f"{len(event_dicts(dump))} recorded")


def test_commdebug_dump_filters_and_noise(viewer, real_dumps):
    page = viewer.open(real_dumps["commdebug"])
    page.select_option("#op-filter", "all_gather")
    expect(page.locator("#match-count")).to_have_text("1 match")
    assert page.eval_on_selector_all("#tree .row.match", "rs => rs.map(r => r.parentNode.dataset.fqn)") == [
        "Transformer.output"]
    page.select_option("#op-filter", "")
    viewer.expand_all()
    viewer.select("Transformer.layers.0.attention.wq")
    per_level = []
    for level in (1, 2, 3):
        page.click(f'#noise label:has(input[value="{level}"])')
        per_level.append(sum(int(row[2]) for row in viewer.table("detail-ops")))
    assert 0 < per_level[0] < per_level[1] < per_level[2]


def test_reference_dump(viewer, real_dumps, walk):
    dump = real_dumps["reference"]
    page = viewer.open(dump)
    expect(page.locator("#format")).to_have_text("reference CommDebugMode dump")
    viewer.expand_all()
    cells = viewer.cells()
    for node in walk(dump):
        shown = cells[node["fqn"]]
        for phase in ("forward", "backward"):
            assert shown[phase] == str(sum(c for _, c in node[f"collectives_{phase}"])), node["fqn"]
        assert shown["checkpoint"] == shown["optimizer"] == shown["bytes"] == "—"
    # The same run recorded by commdebug: the reference's calls per op key match ours.
    ours = Counter()
    for event in event_dicts(real_dumps["plain"]):
        ours[event["key"]] += 1
    theirs = Counter()
    for key in ("collectives_forward", "collectives_backward"):
        for op_key, count in dump[key]:
            theirs[op_key] += count
    assert theirs == ours
    expect(page.locator("#total-collectives")).to_have_text(str(sum(ours.values())))


def test_screenshot(viewer, real_dumps, artifacts):
    page = viewer.open(real_dumps["commdebug"], title="TP transformer, 8 ranks, 2 steps")
    for fqn in ("Transformer.layers.0", "Transformer.layers.0.attention"):
        viewer.row(fqn).locator(".caret").click()
    viewer.select("Transformer.layers.0.attention.wo")
    page.click('#noise label:has(input[value="1"])')
    path = artifacts / "real_tp_transformer.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
