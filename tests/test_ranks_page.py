"""The folder page's numbers are each rank's own (issue 32): on a folder whose ranks all differ
(every rank's sizes and latencies its own), every per-rank and per-(rank, step) figure the page
embeds equals what that rank's dump says, times exactly (issue 38: the exact sums of its
latencies, never rounded for the page's size)."""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections import defaultdict
from pathlib import Path

import pytest

import commdebug
from commdebug.model.trace import PHASES
from visualizer import ranks_data

from synthetic import transformer_dump

RANKS = 6
STEPS = 3


def write_distinct_ranks(folder: Path, ranks: int = RANKS, steps: int = STEPS) -> list[Path]:
    """`ranks` dumps of one model in which no two ranks agree: rank r's activations hold
    32 + 8r tokens (its sizes) and its calls run 1 + r/7 times slower (its latencies)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        dump = transformer_dump(layers=1, steps=steps, world_size=ranks, rank=r, dim=64, ffn=256, vocab=256,
                                tokens=32 + 8 * r, latency_scale=1 + r / 7)
        path = folder / f"rank{r}.json"
        path.write_text(json.dumps(dump), encoding="utf-8")
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def distinct(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("distinct") / "job"
    write_distinct_ranks(folder)
    return folder


def floats(text: str) -> list[float | None]:
    """Exact times as the page embeds them ("<runs of f, z, n>:<base64 of little-endian
    doubles>"), decoded independently of visualizer.exact_floats."""
    kinds, packed = text.split(":")
    raw = base64.b64decode(packed)
    doubles = iter(struct.unpack(f"<{len(raw) // 8}d", raw))
    out: list[float | None] = []
    for count, kind in re.findall(r"(\d*)([fzn])", kinds):
        out += [next(doubles) if kind == "f" else 0.0 if kind == "z" else None for _ in range(int(count or 1))]
    assert next(doubles, None) is None
    return out


def _decoded(value):
    """A block or matrix with every time row decoded, as util.js' decodeFloats does."""
    if isinstance(value, str):
        return floats(value)
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


class Page:
    """What the folder page embeds, decoded the way ranks_viewer.js and heatmap.js read it."""

    def __init__(self, folder: Path) -> None:
        self.index, texts = ranks_data(folder)
        self.blocks = [_decoded(json.loads(t)) for t in texts]
        heat = self.index["heat"]
        self.steps, self.ops = heat["steps"], heat["ops"]
        self.matrices = self.blocks[heat["block"]]

    def block(self, i: int | None):
        return None if i is None else self.blocks[i]

    def cells(self, entry: dict) -> dict[tuple[int, str], tuple[int, int, float | None]]:
        c = entry["cells"]
        keys, calls, nbytes = self.block(c["keys"]), self.block(c["calls"]), self.block(c["bytes"])
        seconds = self.block(c["time_s"])
        return {(keys[2 * i], self.ops[keys[2 * i + 1]]): (calls[i], nbytes[i], None if seconds is None else seconds[i])
                for i in range(len(calls))}

    def matrix_row(self, name: str, i: int) -> list:
        m = self.matrices[name]
        return m["rows"][m["of"][i]]


def own_figures(path: Path) -> dict:
    """A rank's figures straight from its dump: times are the exact sums (math.fsum) of its
    latencies, per (step, op) (``cells``), per step and per op (``steps``, ``ops``: the exact
    sums of the exact cells, as the heatmap's rows hold them)."""
    trace = commdebug.load(path)
    cells: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0, []])
    for e in trace.events:
        c = cells[(e.step, e.op)]
        c[0] += 1
        c[1] += e.size_bytes
        c[2].append(e.latency_s)
    exact = {key: (c[0], c[1], math.fsum(c[2])) for key, c in cells.items()}
    modules = {fqn: ([trace.phase_totals(fqn, p)[0] for p in PHASES], sum(trace.phase_totals(fqn, p)[1] for p in PHASES))
               for fqn, _ in trace.walk()}
    totals = trace.totals()
    by = {"steps": {}, "ops": {}}
    for (step, op), (_, _, t) in exact.items():
        by["steps"].setdefault(step, []).append(t)
        by["ops"].setdefault(op, []).append(t)
    return {"collectives": totals["collectives"], "bytes": totals["bytes"],
            "seconds": math.fsum(e.latency_s for e in trace.events), "cells": exact, "modules": modules,
            "steps": {k: math.fsum(v) for k, v in by["steps"].items()}, "ops": {k: math.fsum(v) for k, v in by["ops"].items()}}


def test_folder_ranks_all_differ(distinct):
    """The premise: no two ranks share a size or a latency, so a figure of the wrong rank shows."""
    figures = [own_figures(p) for p in sorted(distinct.glob("rank*.json"))]
    assert len({f["bytes"] for f in figures}) == RANKS
    assert len({round(f["seconds"], 9) for f in figures}) == RANKS


def test_every_figure_on_the_page_is_the_ranks_own(distinct):
    page = Page(distinct)
    entries = page.index["ranks"]
    assert [e["rank"] for e in entries] == list(range(RANKS))
    fqns = page.index["modules"]["fqn"]
    for i, entry in enumerate(entries):
        own = own_figures(distinct / entry["file"])
        r = entry["rank"]
        # totals
        assert (entry["collectives"], entry["bytes"], entry["seconds"]) == (own["collectives"], own["bytes"], own["seconds"]), r
        assert page.block(entry["blocks"]["time"])[0] == own["seconds"], r  # Global's time: the rank's
        # per module: calls per phase and bytes, descendants included
        counts, nbytes = page.block(entry["blocks"]["counts"]), page.block(entry["blocks"]["bytes"])
        for m, fqn in enumerate(fqns):
            assert (counts[4 * m: 4 * m + 4], nbytes[m]) == tuple(own["modules"][fqn]), (r, fqn)
        # per (step, op): what a clicked heatmap cell lists
        cells = page.cells(entry)
        assert set(cells) == set(own["cells"]), r
        assert cells == own["cells"], r  # calls, bytes and the exact time of each (step, op)
        # per step: the heatmap's row of this rank
        for metric, k in (("calls", 0), ("bytes", 1)):
            row = page.matrix_row(f"step_{metric}", i)
            assert row == [sum(v[k] for (s, _), v in own["cells"].items() if s == step) for step in page.steps], (r, metric)
        assert page.matrix_row("step_time", i) == [own["steps"][step] for step in page.steps], r
        # per op, over every step: the spread's row
        op_row = page.matrix_row("op_bytes", i)
        assert op_row == [sum(v[1] for (_, o), v in own["cells"].items() if o == op) for op in page.ops], r
        assert page.matrix_row("op_time", i) == [own["ops"][op] for op in page.ops], r


def test_equal_ranks_still_share_their_blocks(tmp_path):
    """Ranks that agree are stored once (what keeps a thousand ranks' page small)."""
    folder = tmp_path / "same"
    folder.mkdir()
    dump = json.dumps(transformer_dump(layers=1, steps=2, world_size=4, rank=0, dim=64, ffn=256, vocab=256, tokens=32))
    for r in range(4):
        (folder / f"rank{r}.json").write_text(dump.replace('"rank":0', f'"rank":{r}').replace('"rank": 0', f'"rank": {r}'))
    page = Page(folder)
    assert len({e["cells"]["time_s"] for e in page.index["ranks"]}) == 1
    assert len({e["blocks"]["counts"] for e in page.index["ranks"]}) == 1
