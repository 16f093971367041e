"""Self-contained HTML viewer for commdebug / CommDebugMode JSON dumps.

Two renderers, each a model in and the page's text out, written by ``commdebug.write_output``:

- `render_html(trace)` returns one page with its CSS, JS and the dump inlined: it makes no
  network request, so it can be mailed around and opened from file://.
- `render_ranks_html(commdebug.rank_modules(folder))` returns one page for a folder of per-rank
  dumps (``rank0.json``, ``rank1.json``, ...): the module tree once, each rank's numbers per
  module, and the findings of ``commdebug check`` marked on the modules they name.

The dump is untrusted (module names and placements come from user code): the page builds DOM
with textContent only, and a Content-Security-Policy allows no script but the viewer's own, by
hash. This package uses only commdebug's public API (``commdebug.__all__``).

    >>> commdebug.write_output("comm.html", render_html(commdebug.load("comm.json")))   # doctest: +SKIP
"""

from __future__ import annotations

import base64
import json
import math
import os
import pathlib
import struct
from collections.abc import Mapping
from typing import Any

import markupsafe

import commdebug
from visualizer import assets

__all__ = ["render_html", "write_html", "predictions_data", "ranks_data", "heat_data", "traffic_data", "overlap_data",
           "render_ranks_html", "write_ranks_html"]

# Inside <script> the HTML parser only looks for "</script" (and "<!--"), but escaping every
# <, > and & makes the embedded JSON inert wherever it lands. U+2028/U+2029 are legal in JSON
# yet line terminators in older JS parsers.
_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


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


def render_html(dump: commdebug.Trace | Mapping[str, Any] | None, *, title: str = "commdebug",
                cluster: Any = None, noise_level: int = 3) -> str:
    """Return the viewer page for a trace, or the empty viewer for None.

    `dump` may also be a parsed JSON dump, embedded as it is (torch's own CommDebugMode writes
    one the page reads too); one that is not a dump, or has an unknown schema_version, renders
    a page that says so. The empty viewer opens a dump dropped on it or picked with its file
    input.

    With a cluster (`cluster`: a preset name, cluster file, dict or Cluster; default: the
    dump's ``metadata.cluster``), the page also shows predicted times on it (see
    :func:`predictions_data`), computed here and embedded: a dump dropped on the page later
    shows none. `noise_level` filters a trace's op rows as ``generate_json_dump`` does.

    >>> html = render_html(commdebug.load("comm.json"), cluster="h100-ib400")   # doctest: +SKIP
    """
    template, css, js, csp = assets.page_assets()
    data = commdebug.to_dump_dict(dump, noise_level) if isinstance(dump, commdebug.Trace) else dump
    predicted = None if dump is None else predictions_data(dump, cluster)
    return template.render(
        title=title, csp=csp, css=markupsafe.Markup(css), js=markupsafe.Markup(js),
        dump_json=None if data is None else markupsafe.Markup(_embed(data)),
        predicted_json=None if predicted is None else markupsafe.Markup(_embed(predicted)),
        ranks_json=None, blocks=[], late_blocks=[],
    )


def write_html(path: str | os.PathLike[str], dump: commdebug.Trace | Mapping[str, Any] | None, *,
               title: str = "commdebug", cluster: Any = None) -> pathlib.Path:
    """``commdebug.write_output(path, render_html(dump, ...))``: the page, written atomically."""
    commdebug.write_output(path, render_html(dump, title=title, cluster=cluster))
    return pathlib.Path(path)


def _sig(seconds: float | None) -> float | None:
    # 6 significant digits: what a page can show, and half the text of a full float
    return None if seconds is None or not math.isfinite(seconds) else float(f"{seconds:.6g}")


def predictions_data(dump: object, cluster: Any = None) -> dict[str, Any] | None:
    """What the page embeds about predictions, or None without a cluster (or when `dump`, a
    trace or parsed JSON, is not a commdebug dump the page could show): ``cluster`` (name),
    ``description``, ``notes``, ``total_s``, ``events`` (predicted seconds of each event, in the
    dump's order, null where not predicted), ``modules`` ({fqn: {phase: seconds}}, descendants
    included) and ``lines`` ({fqn: {"phase\tkey\tgroup": seconds}}, a module's collective rows).
    """
    if isinstance(dump, commdebug.Trace):
        trace = dump
    elif isinstance(dump, Mapping):
        section = dump.get("commdebug")
        meta = section.get("metadata") if isinstance(section, Mapping) else None
        if cluster is None and not (isinstance(meta, Mapping) and meta.get("cluster") is not None):
            return None  # the common case: no cluster, no parse of the dump
        try:
            trace = commdebug.from_dump_dict(dump)
        except commdebug.DumpError:
            return None  # the page itself says what is wrong with it
    else:
        return None  # JSON that is no dump at all: the page says so
    predicted = commdebug.trace_predictions(trace, cluster)
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
# what the page shows of each rank's metadata
_META = ("rank", "world_size", "hostname", "backend", "torch_version", "steps", "pid", "ended_by", "run_id",
         "capture", "detail_every", "detail_steps", "fault")


def exact_floats(values: Any) -> str:
    """Times as the page embeds them, exact: "<kinds>:<doubles>", where <kinds> says what each
    value is in runs ("3f": three values from <doubles>, "z" a zero, "n" none; a run's count is
    left out when 1) and <doubles> holds the other values' IEEE doubles, little-endian, in
    base64 (util.js' ``decodeFloats`` reads it). A double takes 17 decimal digits to come back
    exact, 10.7 characters here; a module that issued nothing costs a letter.

    >>> exact_floats([0.5, 0.25, 0.0, 0.0, None])
    '2f2zn:AAAAAAAA4D8AAAAAAADQPw=='
    """
    kinds: list[str] = []
    doubles: list[float] = []
    for v in values:
        if v is None or v != v:
            kinds.append("n")
        elif v == 0.0 and math.copysign(1.0, v) > 0:
            kinds.append("z")
        else:
            kinds.append("f")
            doubles.append(v)
    runs, i = [], 0
    while i < len(kinds):
        j = i
        while j < len(kinds) and kinds[j] == kinds[i]:
            j += 1
        runs.append(f"{j - i if j - i > 1 else ''}{kinds[i]}")
        i = j
    packed = struct.pack(f"<{len(doubles)}d", *doubles)
    return "".join(runs) + ":" + base64.b64encode(packed).decode("ascii")


class _Blocks:
    """Numeric arrays as JSON text, each distinct one stored once (ranks of a job often agree):
    whole numbers as a JSON array, times as the JSON string of :func:`exact_floats`.

    Keyed by the values, never by object identity: a temporary tuple's id is reused once it is
    freed, which handed every rank the first rank's block."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._of: dict[tuple, int] = {}  # (kind, values) -> block

    def add(self, values: tuple, *, floats: bool = False) -> int:
        key = (floats, values)
        i = self._of.get(key)
        if i is None:
            i = self._of[key] = len(self.texts)
            data = exact_floats(values) if floats else values
            self.texts.append(json.dumps(data, separators=(",", ":"), allow_nan=False))
        return i


def ranks_data(folder: Any) -> tuple[dict[str, Any], list[str]]:
    """What the folder page embeds for ``commdebug.rank_modules(folder)``'s result (or a folder
    path): (index, blocks).

    `index` holds the union of the ranks' module trees, one entry per rank (metadata, totals
    and the ids of its blocks), ``commdebug check``'s result, and ``heat``: the folder's steps
    and ops, and the id of the block of its rank x step and rank x op matrices (see
    :func:`heat_data`). `blocks` are JSON arrays of numbers: per module in the index's order, a
    rank's calls per phase (four per module, descendants included, null where the rank lacks
    the module), its bytes, and its timed seconds (when timed); per rank, its (step, op) keys
    (as step, op index pairs) and their calls, bytes and seconds (``cells``); and the heat
    block. Times are exact (:func:`exact_floats`): the page adds them up and rounds once, to
    display. Each finding and side of the check carries ``text``, worded as ``commdebug
    check`` prints it. When some rank has all_to_all or send/recv calls, ``traffic``
    (:func:`traffic_data`) and its block; when some rank has a profile, ``overlap``
    (:func:`overlap_data`) and its block of each rank's per-step compute, overlapped and
    exposed time.
    """
    found = folder if hasattr(folder, "tree") else commdebug.rank_modules(folder)
    blocks = _Blocks()
    heat = heat_data(found)
    op_index = {op: i for i, op in enumerate(heat["ops"])}
    flat_keys: dict[tuple, tuple] = {}  # a rank's keys -> their flat form, made once per distinct keys

    def keys(pairs: tuple) -> tuple:
        flat = flat_keys.get(pairs)
        if flat is None:
            flat = flat_keys[pairs] = tuple(v for step, op in pairs for v in (step, op_index[op]))
        return flat

    # how each rank ended, worded as ``commdebug check`` words it (its stream, fault record, error)
    endings = {s.rank: commdebug.rank_ending(s) for s in found.check.rank_summaries}
    ranks = []
    for r in found.ranks:
        entry: dict[str, Any] = {"rank": r.rank, "file": r.file, "format": r.format,
                                 "meta": {k: r.metadata[k] for k in _META if k in r.metadata},
                                 "events": r.events, "tree": r.has_tree, "notes": list(r.notes),
                                 "ending": endings.get(r.rank)}
        if r.has_tree:
            entry.update(collectives=r.collectives, bytes=r.total_bytes, seconds=r.total_seconds,
                         blocks={"counts": blocks.add(r.counts or ()), "bytes": blocks.add(r.bytes or ()),
                                 "time": None if r.seconds is None else blocks.add(r.seconds, floats=True)})
        if r.step_ops is not None:
            so = r.step_ops
            entry["cells"] = {"keys": blocks.add(keys(so.keys)), "calls": blocks.add(so.calls),
                              "bytes": blocks.add(so.bytes), "time_s": None if so.seconds is None else blocks.add(so.seconds, floats=True)}
        ranks.append(entry)
    types = sorted(set(found.tree.types), key=found.tree.types.index)
    type_id = {t: i for i, t in enumerate(types)}
    index = {
        "format": RANKS_FORMAT,
        "folder": found.folder.name or str(found.folder),
        "phases": list(commdebug.PHASES),
        "modules": {"fqn": list(found.tree.fqns), "parent": list(found.tree.parents),
                    "type": [type_id[t] for t in found.tree.types], "types": types},
        "ranks": ranks,
        # the page lists findings and notes; each rank's ending is in its own entry's meta
        "check": _check_data(found.check),
        "errors": list(found.errors),
    }
    matrices = heat.pop("matrices")
    heat["block"] = len(blocks.texts)
    blocks.texts.append(json.dumps(_finite(matrices), separators=(",", ":"), allow_nan=False))
    index["heat"] = heat
    traffic = traffic_data(found.traffic)
    if traffic is not None:
        cells = traffic.pop("cells")
        traffic["block"] = len(blocks.texts)
        blocks.texts.append(json.dumps(cells, separators=(",", ":")))
        index["traffic"] = traffic
    overlap = overlap_data(found)
    if overlap is not None:
        rows = overlap.pop("rows")
        overlap["block"] = len(blocks.texts)
        blocks.texts.append(json.dumps(_finite(rows), separators=(",", ":"), allow_nan=False))
        index["overlap"] = overlap
    return _finite(index), blocks.texts


def _check_data(result: Any) -> dict[str, Any]:
    """``check``'s result as the page lists it (each rank's ending is in its own entry's meta),
    each finding and side with the ``text`` the command line prints for it."""
    data = {k: v for k, v in result.to_dict().items() if k != "rank_summaries"}
    data["no_verdict"] = commdebug.no_verdict(result)  # the calls name no group: no verdict, as `commdebug check` says
    data["among"] = result.among  # "among ranks 2-3 of 4": a node's folder, the others elsewhere
    for f, d in zip(result.findings, data["findings"], strict=True):
        d["text"] = commdebug.describe_finding(f)
        for side, sd in zip(f.sides, d["sides"], strict=True):
            sd["text"] = commdebug.describe_side(side)
    return data


def _rows(rows: list[list], floats: bool = False) -> dict[str, list]:
    """A matrix as its distinct rows and, per rank, the index of its row: ranks of one job
    mostly issue the same calls, so their bytes and calls rows are stored once. `floats`: each
    row as :func:`exact_floats` (times)."""
    distinct: dict[tuple, int] = {}
    of = [distinct.setdefault(tuple(r), len(distinct)) for r in rows]
    return {"rows": [exact_floats(r) if floats else list(r) for r in distinct], "of": of}


def heat_data(found: Any) -> dict[str, Any]:
    """The folder page's rank x step heatmap and per-op spread, from ``rank_modules``'s result:
    ``steps`` and ``ops`` (the columns), ``timed`` (some rank timed its calls), ``chosen``
    (--ranks and --steps, and how many ranks were read for the check only), and ``matrices``:
    per metric (``time``, ``bytes``, ``calls``) a rank x step and a rank x op matrix
    (``step_time``, ``op_time``, ...; times in seconds, each the exact sum of the rank's exact
    (step, op) sums, as :func:`exact_floats`), one row per rank in the index's order, null where
    a rank had no call (or, for time, no timed call; for bytes, no call of known size: the calls
    matrix tells an empty cell from one of unknown figures), each as distinct rows and a row index per
    rank. A timed job whose calls were timed on every member adds ``step_caused``: the wait each
    rank made the others spend where it arrived last (``commdebug check``'s late-rank analysis,
    in seconds, exact; 0 where it never did).
    """
    steps, ops = found.steps(), found.ops()
    step_at = {s: i for i, s in enumerate(steps)}
    op_at = {op: i for i, op in enumerate(ops)}
    per: dict[str, list[list[Any]]] = {f"{axis}_{m}": [] for axis in ("step", "op") for m in ("time", "bytes", "calls")}
    timed = False
    for r in found.ranks:
        so = r.step_ops
        # per axis: its times (each cell's exact sums, added up exactly below), bytes and calls
        # rows (None: no call there)
        cols: dict[str, list[list[Any]]] = {"step": [[None] * len(steps) for _ in range(3)],
                                            "op": [[None] * len(ops) for _ in range(3)]}
        if so is not None:
            timed = timed or so.seconds is not None
            seconds = so.seconds or (None,) * len(so.keys)
            for (step, op), c, b, t in zip(so.keys, so.calls, so.bytes, seconds, strict=True):
                for axis, i in (("step", step_at[step]), ("op", op_at[op])):
                    time_row, bytes_row, calls_row = cols[axis]
                    if t is not None:
                        if time_row[i] is None:
                            time_row[i] = []
                        time_row[i].append(t)
                    if b is not None:  # a (step, op) whose sizes are not known leaves the cell null
                        bytes_row[i] = (bytes_row[i] or 0) + b
                    calls_row[i] = (calls_row[i] or 0) + c
        for axis in ("step", "op"):
            time_row, bytes_row, calls_row = cols[axis]
            per[f"{axis}_time"].append([None if t is None else math.fsum(t) for t in time_row])
            per[f"{axis}_bytes"].append(bytes_row)
            per[f"{axis}_calls"].append(calls_row)
    late = getattr(found.check, "late", None)
    if late is not None and late.analysed:
        per["step_caused"] = []
        for r in found.ranks:
            known = r.step_ops is not None and r.step_ops.seconds is not None
            per["step_caused"].append([late.by_step.get((s, r.rank), 0.0) if known else None for s in steps])
    return {"steps": steps, "ops": ops, "timed": timed,
            "chosen": {"ranks": found.ranks_chosen, "steps": found.steps_chosen, "ranks_left_out": found.ranks_left_out},
            "matrices": {name: _rows(rows, floats=name.endswith(("_time", "_caused"))) for name, rows in per.items()}}


MATRIX_MEMBERS = 64  # groups up to this size embed every pair of every step
TOP_PAIRS = 256  # a larger group embeds each step's heaviest pairs only
CELL_BUDGET = 200_000  # pairs embedded over all groups and steps; past it, the least uneven steps are left out
IMBALANCE_ROWS = 20_000  # imbalance rows embedded, worst first


def traffic_data(t: Any) -> dict[str, Any] | None:
    """The folder page's traffic between ranks, from ``rank_modules(folder).traffic`` (what
    ``commdebug.traffic_path(folder, by_step=True)`` gives, of the ranks and steps chosen:
    ``summary --by peer`` per step, and ``report``'s all_to_all imbalance; None where no rank
    has an all_to_all or send/recv); None when no rank recorded any. ``groups``: per group
    (its label, as the rows name it) its ``members`` (global ranks in its rows), the ``steps`` embedded, ``steps_total``, and
    ``top_pairs`` (None: every pair; else each step's heaviest pairs only, the group being over
    :data:`MATRIX_MEMBERS` members); ``imbalance``: per group, rows ``[step, factor, rank,
    bytes]`` (at most :data:`IMBALANCE_ROWS`, worst first); ``limits``; and ``cells``: per
    group, per embedded step, its rows flattened as ``src, dst, calls, bytes``. Past
    :data:`CELL_BUDGET` pairs, a group's least uneven steps are left out (``steps_total`` says
    how many there were)."""
    if t is None or not t.peers:
        return None
    by_group: dict[str, dict[int, list[Any]]] = {}
    for row in t.peers:
        by_group.setdefault(row.group, {}).setdefault(row.step, []).append(row)
    factors = {(i.group, i.step): (i.factor or 0.0) for i in t.imbalance}
    imbalance: dict[str, list[list[Any]]] = {}
    for i in t.imbalance[:IMBALANCE_ROWS]:
        imbalance.setdefault(i.group, []).append([i.step, None if i.factor is None else round(i.factor, 4), i.rank, i.bytes])
    groups, cells, used = [], [], 0
    for label in sorted(by_group):
        steps = by_group[label]
        members = sorted({r.src for rows in steps.values() for r in rows} | {r.dst for rows in steps.values() for r in rows})
        capped = len(members) > MATRIX_MEMBERS
        kept: dict[int, list[Any]] = {}
        for step in sorted(steps, key=lambda s: (-factors.get((label, s), 0.0), s)):  # the worst steps first
            rows = steps[step]
            if capped:
                rows = sorted(rows, key=lambda r: (-r.bytes, r.src, r.dst))[:TOP_PAIRS]
            if kept and used + len(rows) > CELL_BUDGET:
                break
            kept[step] = rows
            used += len(rows)
        shown = sorted(kept)
        groups.append({"group": label, "members": members, "steps": shown, "steps_total": len(steps),
                       "top_pairs": TOP_PAIRS if capped else None})
        cells.append([[v for r in kept[s] for v in (r.src, r.dst, r.calls, r.bytes)] for s in shown])
    return {"groups": groups, "imbalance": imbalance, "imbalance_total": len(t.imbalance), "cells": cells,
            "limits": {"members": MATRIX_MEMBERS, "top_pairs": TOP_PAIRS, "cells": CELL_BUDGET, "imbalance": IMBALANCE_ROWS}}


OVERLAP_COLUMNS = ("step", "calls", "overlapped_us", "exposed_us", "compute_us", "in_window", "exposed_wait_us")
OVERLAP_ROWS = 8_192  # (rank, step) rows embedded at most (1,024 ranks x 8 steps); past it, the least exposed ranks are left out


def overlap_data(found: Any) -> dict[str, Any] | None:
    """The folder page's exposed communication, from ``rank_modules(folder)``'s ranks'
    ``overlap`` (``commdebug overlap --by step``'s rows of each profiled rank); None when no rank
    has a profile. ``columns`` (:data:`OVERLAP_COLUMNS`) name the values of each row; ``rows``:
    per rank, in the index's order, None (no profile, or left out) or its steps' rows flattened,
    one value per column: the step, its calls, its overlapped, exposed and compute time in
    microseconds (the row's seconds x 1e6, not rounded: the page's data-* carry them exact), 1 or
    0 for in HTA's window or not, and the part of the exposed time spent waiting for a late peer
    (null where not known: :mod:`commdebug.analysis.overlap_wait`; the rest of it is transfer).
    Past :data:`OVERLAP_ROWS` rows, the ranks with the least
    exposed time (over their steps in HTA's window) are left out and listed in ``left_out``.

    >>> overlap_data(commdebug.rank_modules("traces/"))["rows"][0][:6]   # doctest: +SKIP
    [1, 3, 8887.2158203125, 1434.66015625, 106295.791015625, 1]
    """
    profiled = [r for r in found.ranks if r.overlap is not None]
    if not profiled:
        return None
    kept, room = set(), OVERLAP_ROWS
    for r in sorted(profiled, key=lambda r: (-sum(o.exposed_s for o in r.overlap if o.in_window), r.rank)):
        if len(r.overlap) > room:
            break
        kept.add(r.rank)
        room -= len(r.overlap)
    rows = [[v for o in r.overlap for v in (o.key, o.calls, _exact_us(o.overlap_s), _exact_us(o.exposed_s),
                                            _exact_us(o.compute_s), 1 if o.in_window else 0, _exact_us(o.exposed_wait_s))]
            if r.overlap is not None and r.rank in kept else None for r in found.ranks]
    return {"columns": list(OVERLAP_COLUMNS), "rows": rows, "left_out": sorted(r.rank for r in profiled if r.rank not in kept),
            "limits": {"rows": OVERLAP_ROWS}}


def _exact_us(seconds: float | None) -> int | float | None:
    """Seconds as microseconds, every digit kept; whole numbers without ".0"."""
    if seconds is None:
        return None
    us = seconds * 1e6
    return int(us) if math.isfinite(us) and us.is_integer() else us


def render_ranks_html(folder: Any, *, title: str | None = None) -> str:
    """Return the folder page for ``commdebug.rank_modules(folder)``'s result (or a folder path).

    The page has the module tree once (the union of the ranks' trees), a rank selector that
    switches the tree's numbers to that rank's, a panel listing every rank's calls, bytes and
    time (when timed) for the selected module with the minimum, median and maximum marked, and
    the findings of ``commdebug check`` listed and marked on the modules they name. Each rank
    contributes only numbers per module, not its events, and the page parses a rank's numbers
    when it first needs them. A file that could not be read is left off, and the page says so.

    >>> folder = commdebug.rank_modules("traces/")                              # doctest: +SKIP
    >>> commdebug.write_output("traces/index.html", render_ranks_html(folder))  # doctest: +SKIP
    >>> folder.errors          # the files left off                             # doctest: +SKIP
    """
    index, blocks = ranks_data(folder)
    template, css, js, csp = assets.page_assets()
    title = title or f"commdebug: {index['folder']} ({len(index['ranks'])} ranks)"
    # the clicked cells' numbers (most of a wide job's page) come after the script: the first view
    # never reads them, so it is drawn while the browser is still reading them in
    early = {i for r in index["ranks"] for i in (r.get("blocks") or {}).values() if i is not None}
    late = {i for r in index["ranks"] for i in (r.get("cells") or {}).values() if i is not None} - early
    late -= {index["heat"]["block"], (index.get("traffic") or {}).get("block")}
    text = [(i, markupsafe.Markup(b.translate(_SCRIPT_SAFE))) for i, b in enumerate(blocks)]
    return template.render(
        title=title, csp=csp, css=markupsafe.Markup(css), js=markupsafe.Markup(js), dump_json=None,
        predicted_json=None, ranks_json=markupsafe.Markup(_embed(index)),
        blocks=[(i, b) for i, b in text if i not in late], late_blocks=[(i, b) for i, b in text if i in late],
    )


def write_ranks_html(path_out: str | os.PathLike[str], folder: Any, *, title: str | None = None) -> pathlib.Path:
    """``commdebug.write_output(path_out, render_ranks_html(folder, ...))``: the folder page,
    written atomically. Raises ``commdebug.DumpError`` when the folder holds no readable rank
    dump with a tree, or dumps of two runs."""
    commdebug.write_output(path_out, render_ranks_html(folder, title=title))
    return pathlib.Path(path_out)
