"""The folder page: one page for a job's per-rank dumps (visualizer.write_ranks_html)."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from visualizer import ranks_data

from synthetic import write_rank_dumps

ODD = "Transformer.layers.1.attention.wo"  # rank 2 issues its first call twice as large
FFN = "Transformer.layers.0.feed_forward"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    write_rank_dumps(out, ranks=4, layers=2, steps=2, odd_rank=2, odd_module=ODD,
                     dim=64, ffn=256, vocab=256, tokens=32)
    return out


def node_of(folder, rank, fqn):
    stack = [json.loads((folder / f"rank{rank}.json").read_text())]
    while stack:
        node = stack.pop()
        if node["fqn"] == fqn:
            return node["commdebug_node"]
        stack.extend(node["children"])
    raise KeyError(fqn)


def test_rank_selector_switches_the_numbers(viewer, folder):
    page = viewer.open_ranks(folder)
    assert viewer.state() == "ready"
    assert page.eval_on_selector_all("#rank-select option", "os => os.map(o => o.textContent)") == ["0", "1", "2", "3"]
    viewer.expand_all()
    for rank in (0, 2, 1):
        page.select_option("#rank-select", label=str(rank))
        expect(page.locator("#meta-rank")).to_have_text(str(rank))
        cells = viewer.cells()
        for fqn in ("Global", ODD, FFN):
            mine = node_of(folder, rank, fqn)
            assert cells[fqn]["data_bytes"] == str(sum(mine["bytes"].values())), (rank, fqn)
            assert [cells[fqn][p] for p in mine["counts"]] == [str(c) for c in mine["counts"].values()]
    assert node_of(folder, 2, ODD)["bytes"] != node_of(folder, 0, ODD)["bytes"]  # the guard


def test_panel_lists_every_ranks_numbers(viewer, folder):
    page = viewer.open_ranks(folder)
    viewer.expand_all()
    for fqn in (FFN, ODD):
        viewer.select(fqn)
        rows = viewer.table("rank-table")
        heads = page.eval_on_selector_all("#rank-table th", "ths => ths.map(t => t.dataset.key)")
        assert heads == ["rank", "forward", "backward", "checkpoint", "optimizer", "calls", "bytes", "time"]
        assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
        for rank, row in enumerate(rows):
            mine = node_of(folder, rank, fqn)
            assert row[1:5] == [str(c) for c in mine["counts"].values()], (fqn, rank)
            assert row[5] == str(sum(mine["counts"].values()))
    # The odd rank's bytes are the maximum, the others the minimum; its time differs too.
    marks = page.eval_on_selector_all('#rank-table td:nth-child(7)', "tds => tds.map(t => t.className)")
    assert ["max" in m for m in marks] == [False, False, True, False]
    assert all("min" in m for i, m in enumerate(marks) if i != 2)
    expect(page.locator('#rank-stats tr[data-stat="calls"]')).to_contain_text("same on every rank")
    expect(page.locator('#rank-stats tr[data-stat="bytes"]')).to_contain_text("max rank 2")
    # Clicking a rank in the panel shows its numbers in the tree.
    page.locator('#rank-table tr[data-rank="2"] td').first.click()
    expect(page.locator("#meta-rank")).to_have_text("2")
    assert viewer.cells()[ODD]["data_bytes"] == str(sum(node_of(folder, 2, ODD)["bytes"].values()))
    expect(page.locator('#rank-table tr.current')).to_have_attribute("data-rank", "2")


def test_planted_mismatch_is_listed_and_marked(viewer, folder):
    index, _ = ranks_data(folder)
    [finding] = index["check"]["findings"]
    assert finding["kind"] == "mismatch" and [s["ranks"] for s in finding["sides"]] == [[0, 1, 3], [2]]
    page = viewer.open_ranks(folder)
    item = page.locator("#findings-list > li.finding")
    expect(item).to_have_count(1)
    expect(item).to_have_attribute("data-kind", "mismatch")
    expect(item.locator(".message")).to_have_text(finding["text"])  # as `commdebug check` words it
    assert finding["text"].startswith(finding["message"])
    expect(page.locator("#check-status")).to_have_text("1 finding")
    # Marked on the module it names (and its ancestors), which is not drawn yet: a link opens it.
    for fqn in ("Transformer.layers.1", "Transformer"):
        if fqn in viewer.drawn():
            assert "has-flagged" in viewer.row(fqn).get_attribute("class")
    item.locator("a.module-link").first.click()
    expect(page.locator("#detail-fqn")).to_have_text(ODD)
    expect(viewer.row(ODD).locator(".flag")).to_have_text("⚠ 1")
    assert "flagged" in viewer.row(ODD).get_attribute("class").split()
    expect(page.locator("#detail-findings li")).to_have_attribute("data-kind", "mismatch")
    assert page.locator("#tree .flag").count() == 1


def test_consistent_folder(viewer, tmp_path):
    write_rank_dumps(tmp_path / "ok", ranks=2, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    page = viewer.open_ranks(tmp_path / "ok")
    expect(page.locator("#check-status")).to_have_text("consistent")
    expect(page.locator("#findings .empty")).to_have_text("No findings.")
    assert page.locator("#tree .flag, #tree .has-flagged").count() == 0


def test_a_single_dump_still_opens_as_before(viewer, dump):
    page = viewer.open(dump)
    assert viewer.state() == "ready"
    expect(page.locator("#rank-picker")).to_be_hidden()
    expect(page.locator("#findings")).to_be_hidden()
    expect(page.locator("#ops-section")).to_be_visible()
    expect(page.locator("#events")).to_be_visible()
    expect(page.locator("#meta-rank")).to_have_text("0")


def _numbers(text: str) -> list:
    """A block: a JSON array of whole numbers, or a JSON string of exact times (base64 doubles)."""
    from test_ranks_page import floats

    value = json.loads(text)
    return floats(value) if isinstance(value, str) else value


def test_page_embeds_numbers_not_events(folder):
    from visualizer import render_ranks_html

    html = render_ranks_html(folder)
    assert "train.py:40" in html  # only in the finding's sides: each side's source, and its text
    assert html.count("train.py:40") == 4
    index, blocks = ranks_data(folder)
    n = len(index["modules"]["fqn"])
    per_module = {i for r in index["ranks"] for i in r["blocks"].values() if i is not None}
    decoded = {i: _numbers(blocks[i]) for i in range(len(blocks)) if i != index["heat"]["block"]}
    assert all(len(decoded[i]) in (n, 4 * n) for i in per_module)
    assert len(per_module) < 3 * len(index["ranks"])  # counts agree across ranks: stored once
    # the rest: each rank's numbers per (step, op), and the heatmap's matrices; numbers only
    per_cell = {i for r in index["ranks"] for i in r["cells"].values() if i is not None}
    assert set(range(len(blocks))) == per_module | per_cell | {index["heat"]["block"]}
    assert all(isinstance(v, (int, float)) or v is None for i in per_cell for v in decoded[i])
    assert html.count('type="application/json"') == 1 + len(blocks)
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    assert "default-src &#39;none&#39;" in policy and "script-src &#39;sha256-" in policy  # as one dump's page


@pytest.mark.parametrize("payload", ["<img src=x onerror=window.__xss=1>", "</script><script>window.__xss=1</script>"])
def test_text_from_dumps_is_escaped(viewer, folder, tmp_path, payload):
    evil = tmp_path / "evil"
    evil.mkdir()
    fqn = f"Transformer.{payload}"
    for f in sorted(folder.glob("rank*.json")):
        text = f.read_text().replace("Transformer.tok_embeddings", fqn.replace("\\", "\\\\").replace('"', '\\"'))
        dump = json.loads(text)
        if f.name == "rank2.json":  # the odd rank's calls come from a poisoned source line
            strings = dump["commdebug"]["events"]["strings"]
            strings[strings.index("train.py:40")] = payload
            dump["commdebug"]["metadata"]["hostname"] = payload
        (evil / f.name).write_text(json.dumps(dump))
    page = viewer.open_ranks(evil, title=payload)
    assert viewer.state() == "ready" and page.title() == payload
    expect(viewer.row(fqn).locator(".name")).to_have_text(payload)
    expect(page.locator("#findings-list .sides li").nth(1)).to_contain_text(f"at {payload}")
    page.select_option("#rank-select", label="2")
    expect(page.locator("#meta-host")).to_have_text(payload)
    assert page.evaluate("document.querySelectorAll('img, #tree script, #findings script').length") == 0
    assert page.evaluate("window.__xss") is None


def test_detail_pane_never_shows_null(viewer, folder):
    """A module without findings once rendered the literal text "null" in its detail pane."""
    page = viewer.open_ranks(folder)
    viewer.expand_all()
    for fqn in ("Global", FFN, ODD):  # without findings, then the flagged one
        viewer.select(fqn)
        expect(page.locator("#detail-fqn")).to_have_text(fqn)
        texts = page.evaluate("""() => [...document.querySelector('#detail-body').childNodes]
            .filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.textContent)""")
        assert "null" not in texts, (fqn, texts)
        assert "null" not in page.locator("#detail-body").inner_text().split(), fqn


def test_summary_counts_collectives_per_rank_and_says_how_the_rank_ended(viewer, tmp_path):
    write_rank_dumps(tmp_path / "job", ranks=2, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    rank1 = tmp_path / "job" / "rank1.json"
    dump = json.loads(rank1.read_text())
    dump["commdebug"]["metadata"]["ended_by"] = "SIGTERM"
    rank1.write_text(json.dumps(dump))
    index, _ = ranks_data(tmp_path / "job")
    per_rank = index["check"]["collectives_per_rank"]["max"]
    assert index["check"]["collectives"] == 2 * per_rank  # the page must not show the sum
    page = viewer.open_ranks(tmp_path / "job")
    expect(page.locator("#check-collectives")).to_have_text(str(per_rank))
    expect(page.locator("#meta-ended")).to_have_text("ending not recorded")
    page.select_option("#rank-select", label="1")
    expect(page.locator("#meta-ended")).to_have_text("ended by SIGTERM")


def test_a_rank_a_fatal_signal_ended_says_the_signal_and_the_programs_line(viewer, tmp_path):
    from commdebug.model.fault import header_text

    write_rank_dumps(tmp_path / "job", ranks=2, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    rank1 = tmp_path / "job" / "rank1.json"
    dump = json.loads(rank1.read_text())
    dump["commdebug"]["metadata"]["ended_by"] = "hang"  # its last dump; then gloo aborted it
    rank1.write_text(json.dumps(dump))
    pid = dump["commdebug"]["metadata"]["pid"]
    (tmp_path / "job" / "rank1.fault").write_text(
        header_text(1, pid, None, 0x7F00) + "signal: 6\nthread: 0x0000000000007f00\n\n"
        "Current thread 0x0000000000007f00 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/job/train.py", line 40 in train_step\n')
    words = "SIGABRT (a native abort), main thread at /job/train.py:40 in train_step, without a final dump"
    page = viewer.open_ranks(tmp_path / "job")
    expect(page.locator("#meta-ended")).to_have_text("ending not recorded")  # rank 0: a synthetic dump, no ending
    page.select_option("#rank-select", label="1")
    expect(page.locator("#meta-ended")).to_have_text(f"ended by {words}; its last dump was written by the hang watchdog")
    expect(page.locator("#summary p.note", has_text=f"ended by {words}")).to_have_count(1)
    expect(page.locator("#check-status")).to_have_text("1 finding")
    assert "SIGKILL" not in page.locator("#summary").inner_text()


def test_an_extreme_most_ranks_share_is_counted_not_listed(viewer, tmp_path):
    """8 ranks, rank 5 issuing one call twice as large: the bytes line names rank 5 as the max and
    counts the 7 ranks at the min instead of listing their numbers."""
    folder = tmp_path / "traces"
    write_rank_dumps(folder, ranks=8, layers=1, steps=1, odd_rank=5, odd_module="Transformer.layers.0.attention.wo",
                     dim=64, ffn=256, vocab=256, tokens=32)
    page = viewer.open_ranks(folder)
    line = page.locator('#rank-stats tr[data-stat="bytes"] td.extremes')
    expect(line).to_have_text(re.compile(r"^max rank 5; 7 ranks tie at \S+ \S+$"))
    assert not re.search(r"\b0, 1\b", line.inner_text())


def test_a_nodes_folder_says_its_verdict_covers_its_ranks(viewer, tmp_path):
    """A node's folder read alone (docs/ranks.md, one node's folder alone): the page's check
    covers the ranks present and names the others, never a rank without a dump."""
    from test_job_folders import write_nodes

    run = write_nodes(tmp_path / "run")
    page = viewer.open_ranks(run / "node1")
    expect(page.locator("#check-status")).to_have_text("consistent among ranks 2-3 of 4")
    expect(page.locator("#findings .empty")).to_have_text("No findings.")
    expect(page.locator("#findings p.note").first).to_have_text(
        f"ranks 0-1 of 4 are not in {run / 'node1'} (no dump, stream or fault record of theirs): they may be in "
        f"{run / 'node0'} beside it; read the parent folder for the whole job")
    page = viewer.open_ranks(run, name="job.html")  # the parent: one job of both nodes
    expect(page.locator("#check-status")).to_have_text("consistent")
    assert page.eval_on_selector_all("#rank-select option", "os => os.map(o => o.textContent)") == ["0", "1", "2", "3"]
