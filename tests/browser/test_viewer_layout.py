"""Layout faults: cut names keep their full text in a tooltip, and the detail panel's tables stay
inside it (they scroll in their own box instead of widening the panel)."""

from __future__ import annotations

from playwright.sync_api import expect

from commdebug.model.dump import from_dump_dict
from commdebug.model.events import encode_events
from commdebug.units import format_duration

from synthetic import transformer_dump

LONG = "a_module_with_a_remarkably_long_attribute_name_" * 4
LONG_TYPE = "class 'some.deeply.nested.package." + "VeryLongModuleClassName" * 4 + "'"
LONG_OP = "aten." + "very_long_custom_operator_" * 5 + ".default"


def long_named_dump() -> tuple[dict, str]:
    """The small transformer with one leaf renamed long, a long type, op and placements."""
    dump = transformer_dump(layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    attention = dump["children"][0]["children"][1]["children"][1]
    wo = next(n for n in attention["children"] if n["fqn"].endswith("attention.wo"))
    old, wo["fqn"] = wo["fqn"], wo["fqn"].replace("attention.wo", f"attention.{LONG}")
    wo["module_type"] = LONG_TYPE
    wo["parameters"] = [["weight", "(Shard(dim=1), " + "Replicate(), " * 12 + ")"]]
    row = wo["operations_forward"][3]
    row["name"] = LONG_OP
    row["input_shape"] = [f"torch.Size([{', '.join(['16384'] * 12)}])"] * 2
    events = dump["commdebug"]["events"]
    strings = events["strings"]
    strings[strings.index(old)] = wo["fqn"]
    return dump, wo["fqn"]


def test_cut_names_carry_their_full_text(viewer):
    dump, fqn = long_named_dump()
    page = viewer.open(dump)
    page.set_viewport_size({"width": 1000, "height": 800})
    viewer.expand_all()
    cut = page.eval_on_selector_all("#tree .name, #tree .type, #events-grid td.clip", """els => els
        .filter(e => e.scrollWidth > e.clientWidth + 1)
        .map(e => [e.className, e.textContent, e.title])""")
    assert {cls for cls, _, _ in cut} >= {"name", "type", "clip"}, cut  # the guard: some are cut
    for cls, text, title in cut:
        assert title, (cls, text)
        if cls == "name":  # the full name; the row shows it relative to its parent
            assert title.endswith("." + text) or title == text, (text, title)
        elif cls == "type":  # the module's class as recorded; the row shows its last part
            assert title.endswith(text + "'"), (text, title)
        else:
            assert title == text, (text, title)
    assert fqn in {title for cls, _, title in cut if cls == "name"}
    assert viewer.row(fqn).locator(".type").get_attribute("title") == LONG_TYPE
    # Short names are not cut down to nothing to make room for a long one.
    widths = page.eval_on_selector_all("#tree .name", "els => els.map(e => e.clientWidth)")
    assert min(widths) > 10


def test_op_filter_names_the_chosen_op(viewer, dump):
    page = viewer.open(dump)
    page.select_option("#op-filter", "reduce_scatter")
    assert page.get_attribute("#op-filter", "title") == "issues reduce_scatter"
    page.select_option("#op-filter", "")
    assert page.get_attribute("#op-filter", "title") == ""


def test_detail_tables_stay_inside_their_panel(viewer):
    dump, fqn = long_named_dump()
    page = viewer.open(dump)
    page.set_viewport_size({"width": 1000, "height": 800})
    viewer.expand_all()
    viewer.select(fqn)
    expect(page.locator("#detail-ops td", has_text=LONG_OP)).to_have_count(1)
    boxes = page.evaluate("""() => {
        const pane = document.getElementById('detail');
        const right = pane.getBoundingClientRect().right;
        return {
          paneOverflow: pane.scrollWidth - pane.clientWidth,
          tables: [...pane.querySelectorAll('table')].map(t => {
            const wrap = t.closest('.table-wrap');
            const style = wrap && getComputedStyle(wrap);
            return {id: t.id, wide: t.getBoundingClientRect().right > right + 1,
                    wrapInside: !!wrap && wrap.getBoundingClientRect().right <= right + 1,
                    wrapScrolls: !!wrap && ['auto', 'scroll'].includes(style.overflowX),
                    overflows: !!wrap && wrap.scrollWidth > wrap.clientWidth};
          }),
        };
    }""")
    assert boxes["paneOverflow"] <= 1, boxes
    tables = {t["id"]: t for t in boxes["tables"]}
    assert tables["detail-ops"]["wide"] and tables["detail-ops"]["overflows"], boxes  # the guard
    for table in boxes["tables"]:
        assert table["wrapInside"] and table["wrapScrolls"], table


def test_event_detail_shows_new_fields(viewer):
    dump = transformer_dump(layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    events = list(from_dump_dict(dump).events)
    events[1] = events[1]._replace(in_flight=True, microbatch=3)
    events[2] = events[2]._replace(op="send", key="c10d.send", seq=None, peer=5, p2p_seq=2, latency_s=None)
    dump["commdebug"]["events"] = encode_events(events)
    page = viewer.open(dump)
    expect(page.locator("#events-count")).to_have_text(f"{len(events)} recorded, 1 in flight")
    rows = page.locator("#events-grid tbody tr")
    expect(rows.nth(1)).to_have_class("in-flight")
    heads = page.eval_on_selector_all("#events-grid th", "ths => ths.map(t => t.dataset.key)")
    assert heads[-3:] == ["microbatch", "peer", "state"]
    assert viewer.table("events-grid")[2][-3:] == ["", "to 5 #2", ""]

    def fields():
        return dict(page.eval_on_selector_all(
            "#event-fields tr", "rs => rs.map(r => [r.dataset.field, r.cells[1].textContent])"))

    rows.nth(1).locator("td").first.click()
    got = fields()
    assert got["state"] == "in flight" and got["microbatch"] == "3"
    assert got["group"] == "mesh_tp[8] (name 0, ranks 0,1,2,3,4,5,6,7)"
    assert got["latency"] == format_duration(events[1].latency_s)
    assert got["bandwidth"].startswith("algbw ")
    assert got["module"] == events[1].module and got["input shapes"] == "[32, 64]"
    expect(page.locator("#event-detail h3")).to_have_css("color", "rgb(207, 34, 46)")

    rows.nth(2).locator("td").first.click()
    got = fields()
    assert got["peer"] == "to rank 5" and got["p2p seq"] == "2" and got["seq"] == "— (point-to-point)"
    assert got["latency"] == "not timed" and got["state"] == "finished"


def test_failed_calls_and_fsdp_units_are_shown(viewer):
    dump = transformer_dump(layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    events = list(from_dump_dict(dump).events)
    error = "RuntimeError: Timed out waiting 10000ms for recv operation to complete"
    events[1] = events[1]._replace(in_flight=True, error=error)
    events[2] = events[2]._replace(unit="Transformer.layers.1")  # another module's parameters
    events[3] = events[3]._replace(unit=events[3].module)
    dump["commdebug"]["events"] = encode_events(events)
    page = viewer.open(dump)
    expect(page.locator("#events-count")).to_have_text(f"{len(events)} recorded, 1 in flight, 1 failed")
    heads = page.eval_on_selector_all("#events-grid th", "ths => ths.map(t => t.dataset.key)")
    assert heads[-2:] == ["unit", "state"]
    table = viewer.table("events-grid")
    assert table[1][-1] == "in flightfailed" and table[2][-2:] == ["Transformer.layers.1", ""]
    assert table[3][-2] == events[3].module and table[0][-2:] == ["", ""]
    # a unit that is another module's is marked
    assert page.locator("#events-grid tbody tr").nth(2).locator("strong").inner_text() == "Transformer.layers.1"

    def fields():
        return dict(page.eval_on_selector_all(
            "#event-fields tr", "rs => rs.map(r => [r.dataset.field, r.cells[1].textContent])"))

    page.locator("#events-grid tbody tr").nth(1).locator("td").first.click()
    got = fields()
    assert got["state"] == "in flightfailed" and got["error"] == error and got["FSDP unit"] == "—"
    page.locator("#events-grid tbody tr").nth(2).locator("td").first.click()
    assert fields()["FSDP unit"] == "Transformer.layers.1" and fields()["error"] == "—"
