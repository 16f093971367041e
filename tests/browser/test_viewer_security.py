"""Dumps are untrusted: names and placements come from user code and must show as text."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from visualizer import write_html

PAYLOADS = ["<img src=x onerror=window.__xss=1>", "</script><script>window.__xss=1</script>"]


def poison(dump, payload):
    """Put `payload` in a module name, a placement, a module type, an op row and an event."""
    transformer = dump["children"][0]
    victim = transformer["children"][0]  # tok_embeddings
    victim["fqn"] = f"Transformer.{payload}"
    victim["module_type"] = payload
    victim["parameters"] = [["weight", payload]]
    victim["operations_forward"][0]["name"] = payload
    victim["operations_forward"][0]["input_sharding"] = [payload]
    events = dump.get("commdebug", {}).get("events")
    if isinstance(events, dict):  # schema 2: text lives in the string table
        strings = events["strings"]
        strings[strings.index("Transformer.tok_embeddings")] = victim["fqn"]
        strings.append(payload)
        events["columns"]["source"] = [len(strings) - 1] * events["count"]
    for event in events if isinstance(events, list) else []:  # schema 1
        event["module"] = event["module"].replace("Transformer.tok_embeddings", victim["fqn"])
        event["source"] = payload
    return victim["fqn"]


def assert_shown_as_text(page, viewer, fqn, payload):
    assert page.evaluate("window.__xss") is None
    assert page.evaluate("document.querySelectorAll('img, #tree script, #detail script').length") == 0
    expect(viewer.row(fqn).locator(".name")).to_have_text(payload)
    viewer.select(fqn)
    expect(page.locator("#detail-fqn")).to_have_text(fqn)
    expect(page.locator("#detail-type")).to_have_text(payload)
    assert viewer.table("detail-params") == [["weight", payload]]
    assert page.locator("#detail-ops td", has_text=payload).count() == 2  # the op name and its sharding
    assert page.evaluate("window.__xss") is None


@pytest.mark.parametrize("payload", PAYLOADS)
def test_payload_in_an_embedded_dump(viewer, dump, payload):
    fqn = poison(dump, payload)
    page = viewer.open(dump)
    assert viewer.state() == "ready"
    assert_shown_as_text(page, viewer, fqn, payload)
    sources = [row[7] for row in viewer.table("events-grid")]
    assert sources.count(payload) == dump["commdebug"]["events"]["count"]
    page.locator("#events-grid tbody tr").nth(1).locator("td").first.click()  # the embedding's call, in detail
    expect(page.locator('#event-fields tr[data-field="source"] td')).to_have_text(payload)
    expect(page.locator('#event-fields tr[data-field="module"] td')).to_have_text(fqn)
    assert page.evaluate("window.__xss") is None


@pytest.mark.parametrize("payload", PAYLOADS)
def test_payload_in_a_picked_reference_dump(viewer, reference_dump, tmp_path, payload):
    reference_dump["children"][0]["fqn"] = "Transformer"  # poison() expects our root's name
    fqn = poison(reference_dump, payload)
    page = viewer.open(None)
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(reference_dump))
    page.set_input_files("#file-input", str(path))
    expect(page.locator("body")).to_have_attribute("data-state", "ready")
    assert_shown_as_text(page, viewer, fqn, payload)


def test_title_payload_is_text(viewer, dump):
    page = viewer.open(dump, title=PAYLOADS[0])
    assert page.title() == PAYLOADS[0]
    expect(page.locator("#title")).to_have_text(PAYLOADS[0])
    assert page.evaluate("window.__xss") is None


def test_policy_forbids_injected_handlers(browser, dump, tmp_path):
    # Defence in depth: even markup injected past the viewer could not run script. Its own page,
    # not the `page` fixture: the refusal is a console error, which that fixture fails on.
    page = browser.new_page()
    refused = []
    page.on("console", lambda msg: refused.append(msg.text) if msg.type == "error" else None)
    page.goto(write_html(tmp_path / "csp.html", dump).as_uri())
    page.wait_for_selector("body[data-state=ready]", state="attached")
    page.evaluate("""() => {
        const div = document.createElement('div');
        div.setAttribute('onclick', 'window.__xss = 1');
        document.body.append(div);
        div.click();
    }""")
    assert page.evaluate("window.__xss") is None
    assert any("Content Security Policy" in text for text in refused)
    page.close()


def test_page_requests_nothing_but_itself(viewer, page, dump):
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    path = viewer.directory / "viewer.html"
    viewer.open(dump)
    viewer.expand_all()
    assert requests == [path.as_uri()]
