"""The table of collective calls (commdebug.events): sorting, paging, links to modules."""

from __future__ import annotations

from playwright.sync_api import expect

from commdebug.units import format_duration

from synthetic import event_dicts, transformer_dump

# header key -> the event field it sorts by
SORT_KEYS = {
    "step": lambda e: e["step"], "phase": lambda e: e["phase"], "op": lambda e: e["op"],
    "bytes": lambda e: e["size_bytes"], "group": lambda e: e["group"],
    "module": lambda e: e["module"], "source": lambda e: e["source"], "latency": lambda e: e["latency_s"],
}


def sorted_indices(events, key, descending):
    """Stable sort, None last in both directions, as the page does."""
    known = [e for e in events if key(e) is not None]
    rest = [e for e in events if key(e) is None]
    return [e["index"] for e in sorted(known, key=key, reverse=descending) + rest]


def shown_indices(viewer):
    return [int(row[0]) for row in viewer.table("events-grid")]


def test_events_in_run_order(viewer, dump):
    page = viewer.open(dump)
    events = event_dicts(dump)
    expect(page.locator("#events-count")).to_have_text(f"{len(events)} recorded")
    rows = viewer.table("events-grid")
    assert [int(r[0]) for r in rows] == [e["index"] for e in events]
    first = events[1]  # the embedding's all_reduce
    assert rows[1] == [str(first["index"]), "0", "forward", "all_reduce", "4.0 KiB", "mesh_tp[8]",
                       "Transformer.tok_embeddings", "train.py:40", format_duration(first["latency_s"])]


def test_sort_by_clicking_headers(viewer):
    # Schema 1 (events as objects) still opens.
    dump = transformer_dump(layers=2, steps=2, tokens=32, dim=64, ffn=256, vocab=256, schema=1)
    events = dump["commdebug"]["events"]
    events[3]["latency_s"] = None  # timing off for some calls: they sort last
    events[0]["source"] = None
    events = event_dicts(dump)
    page = viewer.open(dump)
    for key, field in SORT_KEYS.items():
        header = page.locator(f'#events-grid th[data-key="{key}"]')
        for direction, descending in (("ascending", False), ("descending", True)):
            header.click()
            assert header.get_attribute("aria-sort") == direction, key
            assert shown_indices(viewer) == sorted_indices(events, field, descending), (key, direction)


def test_large_lists_show_a_page_at_a_time(viewer):
    dump = transformer_dump(layers=8, steps=6)
    events = event_dicts(dump)
    assert 200 < len(events) < 400
    page = viewer.open(dump)
    more = page.locator("#events button.more")
    assert len(viewer.table("events-grid")) == 200
    expect(more).to_have_text(f"Show {len(events) - 200} more (200 of {len(events)} shown)")
    more.click()
    assert shown_indices(viewer) == [e["index"] for e in events]
    expect(more).to_be_hidden()
    page.click('#events-grid th[data-key="bytes"]')  # sorting starts again from one page
    assert len(viewer.table("events-grid")) == 200


def test_module_link_selects_the_module(viewer, dump):
    page = viewer.open(dump)
    fqn = "Transformer.layers.1.feed_forward.w1"
    assert fqn not in viewer.drawn()
    page.locator("#events-grid a.module-link", has_text=fqn).first.click()
    expect(page.locator("#detail-fqn")).to_have_text(fqn)
    assert fqn in viewer.shown()
    assert viewer.row(fqn).locator("..").get_attribute("aria-selected") == "true"


def test_dropped_events_are_reported(viewer):
    dump = transformer_dump(layers=2, steps=2, max_events=10)
    page = viewer.open(dump)
    dropped = dump["commdebug"]["events_dropped"]
    assert dropped > 0 and len(viewer.table("events-grid")) == 10
    expect(page.locator("#summary")).to_contain_text(f"{dropped} events were dropped (max_events 10)")


def test_no_events_section_without_events(viewer, reference_dump):
    page = viewer.open(reference_dump)
    expect(page.locator("#events")).to_be_hidden()
