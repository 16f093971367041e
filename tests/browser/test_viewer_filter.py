"""Filtering the tree by module name and by the collective a module issues."""

from __future__ import annotations

from collections import Counter

import pytest
from playwright.sync_api import expect


def ancestors_and_self(fqn, dump, walk):
    """fqns from Global down to `fqn`."""
    path = {}

    def visit(node, trail):
        path[node["fqn"]] = trail + [node["fqn"]]
        for child in node["children"]:
            visit(child, path[node["fqn"]])

    visit(dump, [])
    return path[fqn]


def direct_issuers(dump, walk, op):
    """Modules that issue `op` themselves: their count beyond their children's (counts nest)."""
    def calls(node):
        return sum(c["count"] for c in node["commdebug_node"]["collectives"] if c["op"] == op)
    return [n["fqn"] for n in walk(dump) if calls(n) > sum(calls(c) for c in n["children"])]


def expected_rows(matches, dump, walk):
    """Matches plus their ancestors, in tree order."""
    keep = {a for m in matches for a in ancestors_and_self(m, dump, walk)}
    return [n["fqn"] for n in walk(dump) if n["fqn"] in keep]


def matched(page):
    return page.eval_on_selector_all("#tree .row.match", "rs => rs.map(r => r.parentNode.dataset.fqn)")


def test_search_by_name_keeps_the_path_open(viewer, dump, walk):
    page = viewer.open(dump)
    page.fill("#search", "WQ")  # case-insensitive
    expect(page.locator("#match-count")).to_have_text("2 matches")
    wqs = ["Transformer.layers.0.attention.wq", "Transformer.layers.1.attention.wq"]
    assert matched(page) == wqs
    assert viewer.shown() == expected_rows(wqs, dump, walk)
    page.fill("#search", "")
    expect(page.locator("#match-count")).to_have_text("")
    shown = viewer.shown()  # everything is back, and the paths to the matches stay open
    assert len(shown) > len(expected_rows(wqs, dump, walk)) and set(wqs) <= set(shown)
    assert matched(page) == []


def test_op_filter_lists_the_ops_present(viewer, dump):
    page = viewer.open(dump)
    options = page.eval_on_selector_all("#op-filter option", "os => os.map(o => o.value)")
    assert options == ["", "all_gather", "all_reduce", "barrier", "reduce_scatter"]
    assert set(options[1:]) == set(dump["commdebug"]["summary"]["by_op"])


@pytest.mark.parametrize("op", ["all_gather", "all_reduce", "barrier"])
def test_op_filter_shows_modules_issuing_it(viewer, dump, walk, op):
    page = viewer.open(dump)
    page.select_option("#op-filter", op)
    issuers = direct_issuers(dump, walk, op)
    assert issuers, op
    expect(page.locator("#match-count")).to_have_text(f"{len(issuers)} match{'es' if len(issuers) > 1 else ''}")
    assert matched(page) == issuers
    assert viewer.shown() == expected_rows(issuers, dump, walk)


def test_op_filter_expectations(dump, walk):
    # The oracle above, checked against the synthetic model it runs on.
    assert direct_issuers(dump, walk, "all_gather") == ["Transformer.output"]
    assert direct_issuers(dump, walk, "barrier") == ["Global"]
    leaves = Counter(f.rsplit(".", 1)[-1] for f in direct_issuers(dump, walk, "all_reduce"))
    # Global: the optimizer's gradient-norm all_reduce
    assert leaves == {"Global": 1, "tok_embeddings": 1, "wq": 2, "wo": 2, "w1": 2, "w2": 2}


def test_name_and_op_filters_combine(viewer, dump):
    page = viewer.open(dump)
    page.select_option("#op-filter", "all_reduce")
    page.fill("#search", "layers.1.feed")
    expect(page.locator("#match-count")).to_have_text("2 matches")
    assert matched(page) == ["Transformer.layers.1.feed_forward.w1", "Transformer.layers.1.feed_forward.w2"]


def test_no_match(viewer, dump):
    page = viewer.open(dump)
    page.fill("#search", "no such module")
    expect(page.locator("#match-count")).to_have_text("0 matches")
    assert viewer.drawn() == []
    expect(page.locator("#no-match")).to_have_text("No module matches.")


def test_keyboard_moves_within_the_filtered_tree(viewer, dump):
    page = viewer.open(dump)
    page.fill("#search", "wq")
    expect(page.locator("#match-count")).to_have_text("2 matches")
    page.focus("#tree")
    for _ in range(4):  # from Global: Transformer, layers.0, attention, wq; hidden siblings skipped
        page.keyboard.press("ArrowDown")
    assert page.get_attribute("#tree li.cursor", "data-fqn") == "Transformer.layers.0.attention.wq"
