"""The module tree: counts, lazy drawing, expand/collapse, keyboard navigation."""

from __future__ import annotations

import pytest

L0 = "Transformer.layers.0"


def test_first_level_is_drawn_and_deeper_levels_are_not(viewer, dump):
    page = viewer.open(dump)
    assert viewer.state() == "ready"
    assert page.evaluate("typeof window.__commdebugReady") == "number"
    transformer = dump["children"][0]
    # Global and its only child are open; nothing below the first real level is in the DOM.
    assert viewer.drawn() == ["Global", "Transformer"] + [c["fqn"] for c in transformer["children"]]
    assert viewer.shown() == viewer.drawn()


def test_counts_and_bytes_equal_the_json(viewer, dump, walk):
    viewer.open(dump)
    viewer.expand_all()
    cells = viewer.cells()
    nodes = list(walk(dump))
    assert sorted(cells) == sorted(n["fqn"] for n in nodes)
    total = sum(dump["commdebug_node"]["bytes"].values())
    for node in nodes:
        extra, shown = node["commdebug_node"], cells[node["fqn"]]
        assert [shown[p] for p in ("forward", "backward", "checkpoint")] == [
            str(extra["counts"][p]) for p in ("forward", "backward", "checkpoint")], node["fqn"]
        node_bytes = sum(extra["bytes"].values())
        assert shown["data_bytes"] == str(node_bytes)
        assert float(shown["share"]) == pytest.approx(node_bytes / total, abs=1e-4)
    # Two steps of one 32x64 bf16 all_reduce, plus its recompute in the checkpointed layer 1.
    assert cells[f"{L0}.attention.wo"]["bytes"] == "8.0 KiB"
    assert cells["Transformer.layers.1.attention.wo"]["bytes"] == "16.0 KiB"
    assert cells["Transformer.layers.1.attention.wo"]["checkpoint"] == "2"


def test_caret_toggles_and_children_are_drawn_on_first_expand(viewer, dump):
    viewer.open(dump)
    attention = f"{L0}.attention"
    assert attention not in viewer.drawn()
    viewer.row(L0).locator(".caret").click()
    assert viewer.row(L0).locator("..").get_attribute("aria-expanded") == "true"
    assert attention in viewer.shown()
    assert f"{attention}.wq" not in viewer.drawn()  # only one level at a time
    viewer.row(L0).locator(".caret").click()
    assert attention not in viewer.shown()
    assert attention in viewer.drawn()  # kept, hidden
    assert viewer.row(L0).locator("..").get_attribute("aria-expanded") == "false"


def test_name_click_toggles_and_selects(viewer, dump):
    page = viewer.open(dump)
    viewer.row(L0).locator(".name").click()
    assert f"{L0}.attention" in viewer.shown()
    assert page.text_content("#detail-fqn") == L0
    assert viewer.row(L0).locator("..").get_attribute("aria-selected") == "true"
    viewer.row(L0).locator(".name").click()
    assert f"{L0}.attention" not in viewer.shown()


def test_expand_all_and_collapse_all(viewer, dump, walk):
    page = viewer.open(dump)
    viewer.expand_all()
    assert viewer.shown() == [n["fqn"] for n in walk(dump)]
    page.click("#collapse-all")  # back to the first level
    assert viewer.shown() == ["Global", "Transformer"] + [c["fqn"] for c in dump["children"][0]["children"]]


def test_keyboard_navigation(viewer, dump):
    page = viewer.open(dump)
    page.focus("#tree")
    cursor = lambda: page.get_attribute("#tree li.cursor", "data-fqn")  # noqa: E731
    assert cursor() == "Global"
    for key, expected in [("ArrowDown", "Transformer"), ("ArrowDown", "Transformer.tok_embeddings"),
                          ("ArrowDown", L0), ("ArrowRight", L0), ("ArrowRight", f"{L0}.attention_norm"),
                          ("ArrowDown", f"{L0}.attention"), ("ArrowLeft", L0)]:
        page.keyboard.press(key)
        assert cursor() == expected, key
    assert f"{L0}.attention" in viewer.shown()      # ArrowRight on a closed node opened it
    page.keyboard.press("ArrowLeft")               # and ArrowLeft on an open one closes it
    assert f"{L0}.attention" not in viewer.shown()
    assert cursor() == L0
    page.keyboard.press("ArrowUp")
    assert page.text_content("#detail-fqn") == "Global"  # moving does not select
    page.keyboard.press("Enter")
    assert page.text_content("#detail-fqn") == "Transformer.tok_embeddings"
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    assert cursor() == "Transformer.layers.1"  # layers.0 is closed: its children are skipped


def test_cursor_moves_out_of_what_closes(viewer, dump):
    page = viewer.open(dump)
    cursor = lambda: page.get_attribute("#tree li.cursor", "data-fqn")  # noqa: E731
    viewer.expand_all()
    viewer.select(f"{L0}.attention.wq")
    viewer.row(L0).locator(".caret").click()
    assert cursor() == L0
    viewer.expand_all()
    viewer.select(f"{L0}.attention.wq")
    page.click("#collapse-all")
    assert cursor() == L0  # the nearest row still drawn
    page.focus("#tree")
    page.keyboard.press("ArrowDown")
    assert cursor() == "Transformer.layers.1"
