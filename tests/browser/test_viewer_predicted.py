"""Predicted times on the page (a dump with a cluster): the tree's pred column, the detail's and
the events' pred cells, all showing the figures Python embedded and marked as a model; without
a cluster nothing of it appears."""

from __future__ import annotations

import json

from playwright.sync_api import expect

from commdebug.estimate import PRESETS, predict
from commdebug.model.dump import from_dump_dict
from commdebug.units import format_duration
from visualizer import predictions_data

from .conftest import SMALL
from synthetic import transformer_dump

MODEL_NOTE = "a model, not a measurement"


def ms(seconds: float | None) -> str:
    """The page's time format (fmtSeconds: 3 significant digits, as the text reports print)."""
    return "—" if seconds is None else format_duration(seconds)


def with_cluster(name: str = "h100-ib400") -> dict:
    dump = transformer_dump(layers=2, steps=2, **SMALL)
    dump["commdebug"]["metadata"]["cluster"] = PRESETS[name].to_dict()
    return dump


def test_pred_column_shows_the_embedded_figures(viewer):
    dump = with_cluster()
    embedded = predictions_data(dump)
    # the embedded figures are the model's own
    assert embedded["events"] == [float(f"{s:.6g}") for s in predict(from_dump_dict(dump))]
    page = viewer.open(dump)
    heads = page.eval_on_selector_all(".tree-head > span", "s => s.map(e => e.textContent)")
    assert heads == ["Module", "fwd", "bwd", "ckpt", "opt", "bytes", "pred", "share"]
    assert MODEL_NOTE in page.get_attribute("#pred-head", "title") and "h100-ib400" in page.get_attribute("#pred-head", "title")
    viewer.expand_all()
    for fqn in ("Global", "Transformer.layers.0", "Transformer.layers.1.attention"):
        cell = viewer.row(fqn).locator(".pred")
        total = sum(embedded["modules"][fqn].values())
        expect(cell).to_have_text(ms(total))
        assert float(cell.get_attribute("data-pred")) == total and MODEL_NOTE in cell.get_attribute("title")
    expect(page.locator("#total-pred")).to_have_text(ms(embedded["total_s"]))
    expect(page.locator("#summary")).to_contain_text("predicted on h100-ib400")

    # the selected module's phases and collective rows
    viewer.select("Transformer.layers.0")
    phases = {row[0]: row[-1] for row in viewer.table("detail-phases")}
    for phase, seconds in embedded["modules"]["Transformer.layers.0"].items():
        assert phases[phase] == ms(seconds)
    lines = embedded["lines"]["Transformer.layers.0"]
    heads = page.eval_on_selector_all("#detail-collectives th", "s => s.map(e => e.textContent)")
    assert heads[-1] == "pred"
    shown = sorted(row[-1] for row in viewer.table("detail-collectives"))
    assert shown == sorted(ms(s) for s in lines.values())

    # every call's own prediction, in the list and in its detail
    heads = page.eval_on_selector_all("#events-grid th", "s => s.map(e => e.dataset.key)")
    col = heads.index("pred")
    rows = viewer.table("events-grid")
    assert [r[col] for r in rows] == [ms(s) for s in embedded["events"][:len(rows)]]
    page.locator("#events-grid tbody tr").nth(3).locator("td").first.click()
    detail = page.locator('#event-fields tr[data-field="predicted"] td')
    expect(detail).to_have_text(f"{ms(embedded['events'][3])} on h100-ib400 ({MODEL_NOTE})")


def test_no_cluster_no_pred_column(viewer, dump):
    page = viewer.open(dump)
    assert 'id="predicted"' not in page.content()
    assert viewer.cells()["Global"]["bytes"]  # the tree's columns are the usual ones
    assert page.locator("#pred-head").count() == 0 and page.locator(".pred").count() == 0
    assert "pred" not in page.eval_on_selector_all("#events-grid th", "s => s.map(e => e.dataset.key)")
    assert page.locator("#total-pred").count() == 0
    page.locator("#events-grid tbody tr").first.locator("td").first.click()
    expect(page.locator("#event-fields")).to_be_visible()
    assert page.locator('#event-fields tr[data-field="predicted"]').count() == 0


def test_a_dump_opened_later_shows_no_predictions(viewer, dump, tmp_path):
    page = viewer.open(with_cluster())
    expect(page.locator("#pred-head")).to_be_visible()
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dump))
    page.set_input_files("#file-input", str(other))
    expect(page.locator("#source")).to_have_text("— other.json")
    assert page.locator("#pred-head").count() == 0 and page.locator(".pred").count() == 0
    assert page.eval_on_selector("#tree-pane", "e => e.classList.contains('with-pred')") is False


def test_a_hostile_cluster_name_is_only_text(viewer):
    dump = with_cluster()
    name = '<img src=x onerror="document.title=1"></script>'
    dump["commdebug"]["metadata"]["cluster"]["name"] = name
    page = viewer.open(dump)
    expect(page.locator("#summary")).to_contain_text(f"predicted on {name}")
    assert page.locator("img").count() == 0 and page.title() == "commdebug"
    assert name in page.get_attribute("#pred-head", "title")
