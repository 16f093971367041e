"""A light capture (docs/capture.md) says so in the page's header, with its detail steps."""

from __future__ import annotations

import json

from playwright.sync_api import expect

from synthetic import transformer_dump, write_rank_dumps

SMALL = {"dim": 64, "ffn": 256, "vocab": 256, "tokens": 32}


def light(dump: dict, detail_every: int | None, detail_steps: list[int]) -> dict:
    dump["commdebug"]["metadata"].update(capture="light", detail_every=detail_every, detail_steps=detail_steps)
    return dump


def test_light_dump_names_its_detail_steps(viewer):
    page = viewer.open(light(transformer_dump(layers=2, steps=3, **SMALL), 10, [0, 10, 20]))
    assert viewer.state() == "ready"
    expect(page.locator("#meta-capture")).to_have_text("light capture; detail on steps 0, 10, 20")
    expect(page.locator("#summary .note").filter(has_text="Light capture")).to_have_text(
        "Light capture: DTensor ops and operation rows were recorded only on steps 0, 10, 20 (detail_every=10);"
        " every collective on every step.")


def test_light_dump_without_detail_steps_and_a_long_run(viewer):
    page = viewer.open(light(transformer_dump(layers=1, steps=1, **SMALL), None, []))
    expect(page.locator("#meta-capture")).to_have_text("light capture; no detail steps")
    page = viewer.open(light(transformer_dump(layers=1, steps=1, **SMALL), 100, list(range(0, 10_000, 100))), name="long.html")
    expect(page.locator("#meta-capture")).to_have_text("light capture; detail on steps 0, 100, 200, …, 9900 (100 steps)")


def test_full_and_odd_metadata_add_nothing_or_stay_readable(viewer):
    page = viewer.open(transformer_dump(layers=1, steps=1, **SMALL))  # no capture key: as before
    expect(page.locator("#meta-steps")).to_be_visible()
    assert page.locator("#meta-capture").count() == 0
    full = transformer_dump(layers=1, steps=1, **SMALL)
    full["commdebug"]["metadata"]["capture"] = "full"
    page = viewer.open(full, name="full.html")
    expect(page.locator("#meta-steps")).to_be_visible()
    assert page.locator("#meta-capture").count() == 0
    # a hand-edited dump: steps that are not numbers are left out, never an error
    page = viewer.open(light(transformer_dump(layers=1, steps=1, **SMALL), "ten", [2, "x", None, 0]), name="odd.html")
    expect(page.locator("#meta-capture")).to_have_text("light capture; detail on steps 0, 2")


def test_folder_page_names_each_ranks_capture(viewer, tmp_path):
    paths = write_rank_dumps(tmp_path / "job", ranks=2, layers=1, steps=1, **SMALL)
    dump = json.loads(paths[1].read_text())
    paths[1].write_text(json.dumps(light(dump, 5, [0, 5])))
    page = viewer.open_ranks(tmp_path / "job")
    assert page.locator("#meta-capture").count() == 0  # rank 0 was recorded fully
    page.select_option("#rank-select", label="1")
    expect(page.locator("#meta-capture")).to_have_text("light capture; detail on steps 0, 5")
    expect(page.locator("#summary .note").filter(has_text="Light capture")).to_have_count(1)
