"""render_html / write_html without a browser: embedding, escaping, self-containment, atomic writes."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import stat
from importlib import resources

import pytest

import visualizer
from commdebug import CommDebugError
from visualizer import assets, render_html, write_html

DUMP_SCRIPT = re.compile(r'<script type="application/json" id="dump">(.*?)</script>', re.S)


def embedded(page: str):
    (text,) = DUMP_SCRIPT.findall(page)
    return text


def test_page_is_self_contained(dump):
    page = render_html(dump)
    # Nothing to fetch: the only URL-valued attribute is the inline empty favicon.
    assert re.findall(r'\b(?:src|href|action)=["\']?([^"\'\s>]*)', page) == ["data:,"]
    assert "http://" not in page and "https://" not in page
    assert "default-src 'none'" in html.unescape(page)
    assert json.loads(embedded(page)) == dump


def test_embedded_json_cannot_close_its_script_tag():
    hostile = {"fqn": "</script><script>alert(1)</script> & <!-- \u2028\u2029 >", "children": []}
    page = render_html(hostile)
    text = embedded(page)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == hostile
    assert page.count("<script") == 2  # the data and the viewer, nothing injected


def test_static_assets_cannot_close_their_tags():
    assert not re.search(r"</script|<!--", assets.js(), re.I)
    assert not re.search(r"</style", assets.css(), re.I)


def test_script_is_every_static_js_file_once_and_the_policy_allows_it_by_hash():
    static = resources.files(visualizer) / "static"
    files = sorted(f.name for f in static.iterdir() if f.name.endswith(".js"))
    assert sorted(assets.SCRIPTS) == files  # a new file is listed, or the page would miss it
    script = assets.js()
    for name in assets.SCRIPTS:
        assert script.count((static / name).read_text(encoding="utf-8")) == 1
    page = render_html(None)
    (inline,) = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert inline == script
    policy = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1))
    digest = base64.b64encode(hashlib.sha256(inline.encode("utf-8")).digest()).decode("ascii")
    assert f"script-src 'sha256-{digest}';" in policy


def test_title_is_escaped():
    page = render_html(None, title="<b>run & co</b>")
    assert "<b>run" not in page
    assert page.count("&lt;b&gt;run &amp; co&lt;/b&gt;") == 2  # <title> and the page heading


def test_empty_viewer_embeds_no_dump():
    page = render_html(None)
    assert not DUMP_SCRIPT.search(page)
    assert 'id="dropzone"' in page and 'id="file-input"' in page


def test_non_finite_floats_become_null(dump):
    dump["commdebug"]["events"]["columns"]["latency_s"][0] = float("nan")
    dump["commdebug"]["events"]["columns"]["latency_s"][1] = float("inf")

    def strict(name):
        raise AssertionError(f"{name} in embedded JSON")

    events = json.loads(embedded(render_html(dump)), parse_constant=strict)["commdebug"]["events"]
    assert events["columns"]["latency_s"][:2] == [None, None]


def test_write_html_creates_parents_and_leaves_no_temp_file(tmp_path, dump):
    target = tmp_path / "a" / "b" / "report.html"
    assert write_html(target, dump, title="t") == target
    assert target.read_text(encoding="utf-8") == render_html(dump, title="t")
    assert os.listdir(target.parent) == ["report.html"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_write_html_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    write_html(target, None, title="old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(CommDebugError, match="cannot write .*report.html: disk full"):
        write_html(target, None, title="new")
    assert ">old</title>" in target.read_text(encoding="utf-8")
    assert os.listdir(tmp_path) == ["report.html"]
