"""Self-contained HTML viewer for commdebug / CommDebugMode JSON dumps.

`render_html(dump)` returns one page with its CSS, JS and the dump inlined: it makes no network
request, so it can be mailed around and opened from file://. The dump is untrusted (module names
and placements come from user code): the page builds DOM with textContent only, and a
Content-Security-Policy allows no script but the viewer's own, by hash.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import os
import pathlib
from importlib import resources
from typing import Any

import jinja2
import markupsafe

__all__ = ["render_html", "write_html"]

# Inside <script> the HTML parser only looks for "</script" (and "<!--"), but escaping every
# <, > and & makes the embedded JSON inert wherever it lands. U+2028/U+2029 are legal in JSON
# yet line terminators in older JS parsers.
_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _read(name: str) -> str:
    # importlib.resources, not a path next to __file__: works from a wheel or a zip.
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def _csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


@functools.cache
def _assets() -> tuple[jinja2.Template, str, str, str]:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(_read("templates/page.html.j2"))
    css, js = _read("static/viewer.css"), _read("static/viewer.js")
    # Only the viewer's own <script> and <style> may run; an injected handler or tag cannot,
    # and nothing may be fetched. The data <script type="application/json"> is never executed.
    csp = (
        "default-src 'none'; base-uri 'none'; form-action 'none'; img-src data:; "
        f"script-src {_csp_hash(js)}; style-src {_csp_hash(css)}"
    )
    return template, css, js, csp


def _finite(value: Any) -> Any:
    """`value` with NaN and ±Infinity replaced by None: JSON.parse rejects them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _embed(dump: Any) -> str:
    try:
        text = json.dumps(dump, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN somewhere (e.g. a latency); rare, so only then pay for a copy
        text = json.dumps(_finite(dump), ensure_ascii=False, separators=(",", ":"))
    return text.translate(_SCRIPT_SAFE)


def render_html(dump: dict | None, *, title: str = "commdebug") -> str:
    """Return the viewer page for `dump` (a parsed JSON dump), or the empty viewer for None.

    The empty viewer opens a dump dropped on it or picked with its file input. A dump that is
    not one (or has an unknown schema_version) renders a page that says so.
    """
    template, css, js, csp = _assets()
    data = None if dump is None else markupsafe.Markup(_embed(dump))
    return template.render(
        title=title, csp=csp, css=markupsafe.Markup(css), js=markupsafe.Markup(js), dump_json=data
    )


def write_html(path: str | os.PathLike[str], dump: dict | None, *, title: str = "commdebug") -> pathlib.Path:
    """Write `render_html(dump, title=title)` to `path` atomically and return the path.

    Parent directories are created; a reader never sees a half-written page, and a failed
    write leaves an earlier page as it was.
    """
    from commdebug.fileio import write_text_atomic

    write_text_atomic(path, render_html(dump, title=title))
    return pathlib.Path(path)
