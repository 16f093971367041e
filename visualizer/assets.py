"""The viewer page's template, stylesheet and script, and the Content-Security-Policy that lets
only that stylesheet and script run.

The script is written as several files under ``static/`` (one job each) but the page carries
one inline ``<script>``: :func:`js` joins the files in :data:`SCRIPTS` order inside one function
scope, and :func:`csp` allows exactly that text by its sha256.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from importlib import resources

import jinja2

__all__ = ["SCRIPTS", "template", "css", "js", "csp", "page_assets"]

# Each file may use at load time only what it or an earlier one declares: a class extends an
# earlier class, and main.js, last, starts the page once everything is defined.
SCRIPTS = (
    "util.js",          # helpers, DumpError, formatting
    "model.js",         # parsing a dump into the model the tree and detail read
    "table.js",         # paged tables and the tags their cells show
    "tree.js",          # TreeView
    "base_viewer.js",   # what both pages share
    "dump_viewer.js",   # Viewer: one dump
    "heatmap.js",       # Heatmap: the folder page's rank x step heatmap and per-op spread
    "traffic.js",       # TrafficPanel: the folder page's rank x rank matrix and all_to_all imbalance
    "overlap.js",       # OverlapChart: the folder page's compute, overlapped and exposed time per rank and step
    "ranks_viewer.js",  # RanksViewer: a folder of ranks
    "main.js",          # start-up: picks the viewer for what the page embeds
)

# One scope, so the files share their names without putting any on window; strict throughout.
_SCRIPT_START = '(() => {\n"use strict";\n\n'
_SCRIPT_END = "})();\n"

_PACKAGE = __name__.rpartition(".")[0]


def _read(name: str) -> str:
    # importlib.resources, not a path next to __file__: works from a wheel or a zip.
    return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def _csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


@functools.cache
def template() -> jinja2.Template:
    """The page's jinja2 template (``templates/page.html.j2``), autoescaping."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_read("templates/page.html.j2"))


@functools.cache
def css() -> str:
    """The page's stylesheet."""
    return _read("static/viewer.css")


@functools.cache
def js() -> str:
    """The page's script: the files of :data:`SCRIPTS`, in order, inside one IIFE."""
    return _SCRIPT_START + "\n".join(_read(f"static/{name}") for name in SCRIPTS) + _SCRIPT_END


@functools.cache
def csp() -> str:
    """The page's Content-Security-Policy: the script of :func:`js` and the stylesheet of
    :func:`css`, by hash, and nothing else."""
    # An injected handler or tag cannot run, and nothing may be fetched. The data
    # <script type="application/json"> blocks are never executed, so need no hash.
    return (
        "default-src 'none'; base-uri 'none'; form-action 'none'; img-src data:; "
        f"script-src {_csp_hash(js())}; style-src {_csp_hash(css())}"
    )


def page_assets() -> tuple[jinja2.Template, str, str, str]:
    """(template, css, js, csp), what rendering a page needs."""
    return template(), css(), js(), csp()
