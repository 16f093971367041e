"""Collectives issued by torch.compile'd code (docs/compile.md) are marked on the dump page: a
"compiled" column and badge in the call list, the count in its heading, the detail row, and the
recording's note on attribution in the summary."""

from __future__ import annotations

from playwright.sync_api import expect

from synthetic import transformer_dump

NOTE = ("torch.compile: collectives issued by compiled code are marked (compiled); each belongs to the compiled "
        "module it ran in, not to that module's submodules (compile per block to see each block)")


def test_compiled_calls_are_marked_in_the_list_its_heading_and_the_detail(viewer):
    dump = transformer_dump(layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    cd = dump["commdebug"]
    count = cd["events"]["count"]
    cd["events"]["columns"]["compiled"] = [i % 2 == 0 for i in range(count)]
    cd["metadata"]["compile_notes"] = [NOTE]
    page = viewer.open(dump)
    assert viewer.state() == "ready"
    compiled = (count + 1) // 2
    expect(page.locator("#events-count")).to_contain_text(f"{compiled} from compiled code")
    expect(page.locator("#summary .note").filter(has_text="torch.compile")).to_have_text(NOTE)
    rows = page.locator("#events-grid tbody tr")
    expect(rows.first.locator(".badge.compiled")).to_have_text("compiled")
    assert rows.nth(1).locator(".badge.compiled").count() == 0
    rows.first.click()
    expect(page.locator("#event-detail")).to_contain_text("compiled")


def test_a_dump_without_the_column_shows_no_compiled_column(viewer):
    page = viewer.open(transformer_dump(layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32))
    assert viewer.state() == "ready"
    assert page.locator("#events-grid .badge.compiled").count() == 0
    expect(page.locator("#events-count")).not_to_contain_text("compiled")
