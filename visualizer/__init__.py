"""Self-contained HTML viewer for commdebug / CommDebugMode JSON dumps.

`render_html(dump)` returns one page with its CSS, JS and the dump inlined: it makes no network
request, so it can be mailed around and opened from file://. The dump is untrusted (module names
and placements come from user code): the page builds DOM with textContent only, and a
Content-Security-Policy allows no script but the viewer's own, by hash.

`write_ranks_html(path, folder)` writes one page for a folder of per-rank dumps (``rank0.json``,
``rank1.json``, ...): the module tree once, each rank's numbers per module, and the findings of
``commdebug check`` marked on the modules they name.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import os
import pathlib
import re
from importlib import resources
from typing import Any, Iterator

import jinja2
import markupsafe

__all__ = ["render_html", "write_html", "predictions_data", "ranks_data", "render_ranks_html", "write_ranks_html",
           "write_ranks_page"]

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


def render_html(dump: dict | None, *, title: str = "commdebug", cluster: Any = None) -> str:
    """Return the viewer page for `dump` (a parsed JSON dump), or the empty viewer for None.

    The empty viewer opens a dump dropped on it or picked with its file input. A dump that is
    not one (or has an unknown schema_version) renders a page that says so.

    With a cluster (`cluster`: a preset name, cluster file, dict or Cluster; default: the
    dump's ``metadata.cluster``), the page also shows predicted times on it (see
    :func:`predictions_data`), computed here and embedded: a dump dropped on the page later
    shows none.
    """
    template, css, js, csp = _assets()
    data = None if dump is None else markupsafe.Markup(_embed(dump))
    predicted = None if dump is None else predictions_data(dump, cluster)
    return template.render(
        title=title, csp=csp, css=markupsafe.Markup(css), js=markupsafe.Markup(js), dump_json=data,
        predicted_json=None if predicted is None else markupsafe.Markup(_embed(predicted)),
        ranks_json=None, blocks=[],
    )


def write_html(path: str | os.PathLike[str], dump: dict | None, *, title: str = "commdebug",
               cluster: Any = None) -> pathlib.Path:
    """Write `render_html(dump, title=title, cluster=cluster)` to `path` atomically and return
    the path.

    Parent directories are created; a reader never sees a half-written page, and a failed
    write leaves an earlier page as it was.
    """
    from commdebug.fileio import write_text_atomic

    write_text_atomic(path, render_html(dump, title=title, cluster=cluster))
    return pathlib.Path(path)


def _sig(seconds: float | None) -> float | None:
    # 6 significant digits: what a page can show, and half the text of a full float
    return None if seconds is None or not math.isfinite(seconds) else float(f"{seconds:.6g}")


def predictions_data(dump: Any, cluster: Any = None) -> dict[str, Any] | None:
    """What the page embeds about predictions, or None without a cluster (or when `dump` is not
    a commdebug dump the page could show): ``cluster`` (name), ``description``, ``notes``,
    ``total_s``, ``events`` (predicted seconds of each event, in the dump's order, null where
    not predicted), ``modules`` ({fqn: {phase: seconds}}, descendants included) and ``lines``
    ({fqn: {"phase\tkey\tgroup": seconds}}, a module's collective rows).
    """
    from commdebug.analysis.predicted import trace_predictions
    from commdebug.errors import DumpError
    from commdebug.model.dump import from_dump_dict

    section = dump.get("commdebug") if isinstance(dump, dict) else None
    meta = section.get("metadata") if isinstance(section, dict) else None
    if cluster is None and not (isinstance(meta, dict) and meta.get("cluster") is not None):
        return None  # the common case: no cluster, no second parse of the dump
    try:
        trace = from_dump_dict(dump)
    except DumpError:
        return None  # the page itself says what is wrong with it
    predicted = trace_predictions(trace, cluster)
    if predicted is None:
        return None
    lines: dict[str, dict[str, float | None]] = {}
    for (fqn, phase, key, group), line in predicted.lines.items():
        lines.setdefault(fqn, {})[f"{phase}\t{key}\t{group}"] = _sig(line.seconds)
    return {
        "cluster": predicted.cluster.name,
        "description": predicted.cluster.description,
        "notes": list(predicted.notes),
        "total_s": _sig(predicted.total_s),
        "events": [_sig(s) for s in predicted.seconds],
        "modules": {fqn: {p: _sig(s) for p, s in phases.items()} for fqn, phases in predicted.by_module_phase().items()},
        "lines": lines,
    }


# ---------------------------------------------------------------------------- a folder of ranks

RANKS_FORMAT = "commdebug-ranks"
_PHASES = ("forward", "backward", "checkpoint", "optimizer")
_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.\w+)?$")


def _is_flight_recorder(path: pathlib.Path) -> bool:
    with path.open("rb") as f:
        return f.read(1) == b"\x80"  # a pickle; Flight Recorder's JSON form is told by its keys


class _Blocks:
    """Numeric arrays as JSON text, each distinct one stored once (ranks of a job often agree)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}

    def add(self, values: list) -> int:
        text = json.dumps(values, separators=(",", ":"), allow_nan=False)
        i = self._ids.get(text)
        if i is None:
            i = self._ids[text] = len(self.texts)
            self.texts.append(text)
        return i


def ranks_data(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], list[str]]:
    """What the folder page embeds: (index, blocks).

    `index` holds the union of the ranks' module trees (ranks of one job share it), one entry
    per rank (metadata, totals and the ids of its blocks), and ``commdebug check``'s result.
    `blocks` are JSON arrays of numbers, one value per module in the index's order: a rank's
    calls per phase (four per module, descendants included, null where the rank lacks the
    module), its bytes, and its timed seconds (when timed). Files are read one at a time.
    """
    from commdebug.analysis.check import check
    from commdebug.errors import DumpError
    from commdebug.model.dump import from_dump_dict, read_dump_json
    from commdebug.model.ranks import RankView, job_files, load_rank
    from commdebug.model.trace import GLOBAL

    root = pathlib.Path(folder)
    fqns: list[str] = []
    parents: list[int] = []
    type_ids: list[int] = []
    types: list[str] = []
    index_of: dict[str, int] = {}
    type_index: dict[str, int] = {}
    blocks = _Blocks()
    ranks: list[dict[str, Any]] = []
    errors: list[str] = []

    def module_index(fqn: str, parent: str | None, module_type: str) -> int:
        i = index_of.get(fqn)
        if i is None:
            i = index_of[fqn] = len(fqns)
            fqns.append(fqn)
            parents.append(-1 if parent is None else index_of[parent])
            t = type_index.get(module_type)
            if t is None:
                t = type_index[module_type] = len(types)
                types.append(module_type)
            type_ids.append(t)
        return i

    def views() -> Iterator[RankView]:
        for path in job_files(root):  # refuses a folder mixing two runs
            try:
                if _is_flight_recorder(path):
                    view = load_rank(path)
                else:
                    data = read_dump_json(path)
                    if isinstance(data, dict) and "entries" in data and "pg_config" in data:
                        view = load_rank(path)
                    else:
                        view = _add_rank(path, from_dump_dict(data, str(path)))
                        yield view
                        continue
            except DumpError as e:
                errors.append(str(e))
                continue
            ranks.append({"rank": view.rank, "file": path.name, "format": view.source_format,
                          "meta": _meta(view.metadata), "events": len(view.events), "tree": False,
                          "notes": list(view.notes)})
            yield view

    def _add_rank(path: pathlib.Path, trace: Any) -> RankView:
        rank = trace.metadata.get("rank")
        if not isinstance(rank, int):
            m = _TRAILING_NUMBER.search(path.name)
            rank = int(m.group(1)) if m else len(ranks)
        present = []
        for fqn, _ in trace.walk():
            info = trace.modules[fqn]
            present.append(module_index(fqn, info.parent, info.module_type))
        n = len(fqns)
        counts: list[int | None] = [None] * (4 * n)
        nbytes: list[int | None] = [None] * n
        for fqn, _ in trace.walk():
            i = index_of[fqn]
            total = 0
            for k, phase in enumerate(_PHASES):
                c, b = trace.phase_totals(fqn, phase)
                counts[4 * i + k] = c
                total += b
            nbytes[i] = total if trace.bytes_recorded else None
        seconds: list[float | None] | None = None
        if any(e.latency_s for e in trace.events):
            acc = [0.0] * n
            for e in trace.events:
                if not e.latency_s or not math.isfinite(e.latency_s):  # untimed, NaN or infinite
                    continue
                fqn: str | None = e.module if e.module in trace.modules else GLOBAL
                while fqn is not None:  # descendants included, like the counts
                    acc[index_of[fqn]] += e.latency_s
                    fqn = trace.modules[fqn].parent
            seconds = [None] * n
            for i in present:
                seconds[i] = float(f"{acc[i]:.4g}")
        summary = trace.summary()
        notes = []
        if trace.events_dropped:
            notes.append(f"{trace.events_dropped} older events were dropped (max_events): times cover the rest")
        ranks.append({
            "rank": rank, "file": path.name, "format": "commdebug", "meta": _meta(trace.metadata),
            "events": len(trace.events), "tree": True, "notes": notes,
            "collectives": summary["collectives"], "bytes": summary["bytes"] if trace.bytes_recorded else None,
            "seconds": None if seconds is None else seconds[index_of[GLOBAL]],
            "blocks": {"counts": blocks.add(counts), "bytes": blocks.add(nbytes),
                       "time": None if seconds is None else blocks.add(seconds)},
        })
        return RankView(rank, path, dict(trace.metadata), dict(trace.groups), list(trace.events), notes=notes)

    result = check(views())
    if not any(r["tree"] for r in ranks):
        if errors:  # nothing to show: the reason is the files that could not be read
            more = f" (and {len(errors) - 1} more file{'s' if len(errors) > 2 else ''} not read)" if len(errors) > 1 else ""
            raise DumpError(f"{errors[0]}{more}")
        raise DumpError(f"{root}: no rank dump here has a module tree (commdebug dumps do)")
    ranks.sort(key=lambda r: r["rank"])
    index = {
        "format": RANKS_FORMAT,
        "folder": root.name or str(root),
        "phases": list(_PHASES),
        "modules": {"fqn": fqns, "parent": parents, "type": type_ids, "types": types},
        "ranks": ranks,
        # the page lists findings and notes; each rank's ending is in its own entry's meta
        "check": {k: v for k, v in result.to_dict().items() if k != "rank_summaries"},
        "errors": errors,
    }
    return _finite(index), blocks.texts


def _meta(metadata: dict[str, Any]) -> dict[str, Any]:
    keep = ("rank", "world_size", "hostname", "backend", "torch_version", "steps", "pid", "ended_by", "run_id")
    return {k: metadata[k] for k in keep if k in metadata}


def render_ranks_html(folder: str | os.PathLike[str], *, title: str | None = None) -> str:
    """Return the folder page for the per-rank dumps in `folder` (see :func:`write_ranks_html`)."""
    return _ranks_page(folder, title)[0]


def _ranks_page(folder: str | os.PathLike[str], title: str | None) -> tuple[str, list[str]]:
    """The folder page and the messages of the files it could not read."""
    index, blocks = ranks_data(folder)
    template, css, js, csp = _assets()
    title = title or f"commdebug: {index['folder']} ({len(index['ranks'])} ranks)"
    html = template.render(
        title=title, csp=csp, css=markupsafe.Markup(css), js=markupsafe.Markup(js), dump_json=None,
        predicted_json=None, ranks_json=markupsafe.Markup(_embed(index)),
        blocks=[markupsafe.Markup(b.translate(_SCRIPT_SAFE)) for b in blocks],
    )
    return html, list(index["errors"])


def write_ranks_html(path_out: str | os.PathLike[str], folder: str | os.PathLike[str], *,
                     title: str | None = None) -> pathlib.Path:
    """Write one page for a folder of per-rank dumps and return its path.

    `folder` holds one commdebug dump per rank (``rank0.json``, ``rank1.json``, ...; found by
    :func:`commdebug.model.ranks.job_files`; Flight Recorder files there count for the check
    but have no module tree). The page has the module tree once (the union of the ranks'
    trees), a rank selector that switches the tree's numbers to that rank's, a panel listing
    every rank's calls, bytes and time (when timed) for the selected module with the minimum,
    median and maximum marked, and the findings of ``commdebug check`` listed and marked on the
    modules they name. Each rank contributes only numbers per module, not its events, and the
    page parses a rank's numbers when it first needs them.

    The page is written atomically, like :func:`write_html`. Raises
    :class:`commdebug.errors.DumpError` when the folder holds no readable rank dump with a tree,
    or dumps of two runs. A file that cannot be read is left off (the page says so); use
    :func:`write_ranks_page` to learn which.
    """
    return write_ranks_page(path_out, folder, title=title)[0]


def write_ranks_page(path_out: str | os.PathLike[str], folder: str | os.PathLike[str], *,
                     title: str | None = None) -> tuple[pathlib.Path, list[str]]:
    """:func:`write_ranks_html`, also returning one message per file it could not read (what
    ``commdebug view FOLDER`` prints, exiting 2).

    >>> path, unread = write_ranks_page("traces/index.html", "traces/")   # doctest: +SKIP
    """
    from commdebug.fileio import write_text_atomic

    html, unread = _ranks_page(folder, title)
    write_text_atomic(path_out, html)
    return pathlib.Path(path_out), unread
