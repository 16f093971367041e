"""Opening dumps in the empty viewer (file picker, drag and drop) and rejecting bad input."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

BAD_FILES = [
    ("{not json", "This file is not valid JSON."),
    ("[1, 2, 3]", "This JSON is not a CommDebugMode dump."),
    ('{"fqn": "Global"}', "This JSON is not a CommDebugMode dump."),
    ('{"fqn": "Global", "children": [], "commdebug": {"schema_version": 4}}',
     "Unsupported commdebug schema_version 4."),
    ('{"fqn": "Global", "children": [], "commdebug": {}}', "Unsupported commdebug schema_version (missing)."),
]


def drop(page, text, name="dump.json", target="#dropzone"):
    """Drop a file holding `text` on `target`, as a user dragging it from their desktop would."""
    page.evaluate("""([text, name, target]) => {
        const data = new DataTransfer();
        data.items.add(new File([text], name, {type: "application/json"}));
        const el = document.querySelector(target);
        for (const type of ["dragenter", "dragover", "drop"]) {
          el.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
        }
    }""", [text, name, target])


def expect_reference_view(page, viewer, dump, name):
    expect(page.locator("body")).to_have_attribute("data-state", "ready")
    expect(page.locator("#format")).to_have_text("reference CommDebugMode dump")
    expect(page.locator("#source")).to_have_text(f"— {name}")
    expect(page.locator("#dropzone")).to_be_hidden()
    total = sum(c for key in ("collectives_forward", "collectives_backward") for _, c in dump[key])
    expect(page.locator("#total-collectives")).to_have_text(str(total))
    expect(page.locator("#total-bytes")).to_have_text("not recorded")
    cells = viewer.cells()
    assert cells["Global"]["forward"] == str(sum(c for _, c in dump["collectives_forward"]))
    assert cells["Global"]["checkpoint"] == "—"
    assert "tp-model.layers.0" in cells


def test_empty_viewer(viewer):
    page = viewer.open(None)
    assert viewer.state() == "empty"
    expect(page.locator("#dropzone")).to_be_visible()
    expect(page.locator("#viewer")).to_be_hidden()
    expect(page.locator("#error")).to_be_hidden()


def test_pick_a_reference_dump(viewer, reference_dump, tmp_path):
    page = viewer.open(None)
    path = tmp_path / "comm_mode_log.json"
    path.write_text(json.dumps(reference_dump, indent=4))
    page.set_input_files("#file-input", str(path))
    expect_reference_view(page, viewer, reference_dump, "comm_mode_log.json")


def test_drop_a_reference_dump(viewer, reference_dump):
    page = viewer.open(None)
    drop(page, json.dumps(reference_dump), name="ref.json")
    expect_reference_view(page, viewer, reference_dump, "ref.json")


def test_drop_replaces_the_open_dump(viewer, dump, reference_dump):
    page = viewer.open(dump)
    drop(page, json.dumps(reference_dump), name="ref.json", target="#tree")
    expect_reference_view(page, viewer, reference_dump, "ref.json")
    assert "Transformer" not in viewer.drawn()
    assert page.eval_on_selector_all("#op-filter option", "os => os.length") == 1 + len(
        {key for k in ("collectives_forward", "collectives_backward") for key, _ in reference_dump[k]})


@pytest.mark.parametrize("text,message", BAD_FILES)
def test_bad_file_says_why(viewer, tmp_path, text, message):
    page = viewer.open(None)
    path = tmp_path / "bad.json"
    path.write_text(text)
    page.set_input_files("#file-input", str(path))
    expect(page.locator("#error strong")).to_have_text(message)
    assert viewer.state() == "error"
    expect(page.locator("#dropzone")).to_be_visible()  # never a blank page


def test_bad_drop_keeps_the_open_dump(viewer, dump):
    page = viewer.open(dump)
    drop(page, "{not json", target="#tree")
    expect(page.locator("#error strong")).to_have_text("This file is not valid JSON.")
    expect(page.locator("#viewer")).to_be_visible()
    assert "Transformer" in viewer.shown()


@pytest.mark.parametrize("bad,message", [
    ({"hello": "world"}, "This JSON is not a CommDebugMode dump."),
    ({"fqn": "Global", "children": [], "commdebug": {"schema_version": 99}}, "Unsupported commdebug schema_version 99."),
])
def test_bad_embedded_dump_says_why(viewer, bad, message):
    page = viewer.open(bad)
    expect(page.locator("#error strong")).to_have_text(message)
    expect(page.locator("#dropzone")).to_be_visible()
    expect(page.locator("#viewer")).to_be_hidden()


def test_odd_but_valid_dump_still_renders(viewer):
    # Hand-made or truncated dumps: missing lists, junk entries. Shown, not crashed on.
    odd = {"fqn": "Global", "children": [{"fqn": "M", "children": [], "collectives_forward": [["x", 2], "junk"],
                                          "parameters": [["w"]], "operations_forward": [None, {"name": 3}]}, 7]}
    page = viewer.open(odd)
    assert viewer.state() == "ready"
    assert viewer.cells()["M"]["forward"] == "2"
    viewer.select("M")
    assert viewer.table("detail-params") == [["w", ""]]
    assert viewer.table("detail-ops") == [["forward", "3", "1", "", "", ""]]
    assert page.locator("#error").is_hidden()
