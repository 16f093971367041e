"""The folder page's numbers are each rank's own (issue 32): on a folder whose ranks all differ
(every rank's sizes and latencies its own), every per-rank and per-(rank, step) figure the page
embeds equals what that rank's dump says."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

import commdebug
from commdebug.model.trace import PHASES
from visualizer import ranks_data

from synthetic import transformer_dump

RANKS = 6
STEPS = 3
# the page keeps times to 4 significant digits (rank_modules' precision)
REL = 6e-4


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


class Page:
    """What the folder page embeds, decoded the way ranks_viewer.js and heatmap.js read it."""

    def __init__(self, folder: Path) -> None:
        self.index, texts = ranks_data(folder)
        self.blocks = [json.loads(t) for t in texts]
        heat = self.index["heat"]
        self.steps, self.ops = heat["steps"], heat["ops"]
        self.matrices = self.blocks[heat["block"]]

    def block(self, i: int | None):
        return None if i is None else self.blocks[i]

    def cells(self, entry: dict) -> dict[tuple[int, str], tuple[int, int, float | None]]:
        c = entry["cells"]
        keys, calls, nbytes = self.block(c["keys"]), self.block(c["calls"]), self.block(c["bytes"])
        micros = self.block(c["time_us"])
        return {(keys[2 * i], self.ops[keys[2 * i + 1]]): (calls[i], nbytes[i], None if micros is None else micros[i])
                for i in range(len(calls))}

    def matrix_row(self, name: str, i: int) -> list:
        m = self.matrices[name]
        return m["rows"][m["of"][i]]


def own_figures(path: Path) -> dict:
    """A rank's figures straight from its dump."""
    trace = commdebug.load(path)
    cells: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0, 0.0])
    for e in trace.events:
        c = cells[(e.step, e.op)]
        c[0] += 1
        c[1] += e.size_bytes
        c[2] += e.latency_s
    modules = {fqn: ([trace.phase_totals(fqn, p)[0] for p in PHASES], sum(trace.phase_totals(fqn, p)[1] for p in PHASES))
               for fqn, _ in trace.walk()}
    totals = trace.totals()
    return {"collectives": totals["collectives"], "bytes": totals["bytes"],
            "seconds": sum(e.latency_s for e in trace.events), "cells": dict(cells), "modules": modules}


def close(page_value: float | None, seconds: float) -> bool:
    return page_value is not None and math.isclose(page_value, seconds, rel_tol=REL)


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
        assert (entry["collectives"], entry["bytes"]) == (own["collectives"], own["bytes"]), r
        assert close(entry["seconds"], own["seconds"]), (r, entry["seconds"], own["seconds"])
        # per module: calls per phase and bytes, descendants included
        counts, nbytes = page.block(entry["blocks"]["counts"]), page.block(entry["blocks"]["bytes"])
        for m, fqn in enumerate(fqns):
            assert (counts[4 * m: 4 * m + 4], nbytes[m]) == tuple(own["modules"][fqn]), (r, fqn)
        # per (step, op): what a clicked heatmap cell lists
        cells = page.cells(entry)
        assert set(cells) == set(own["cells"]), r
        for key, (calls, b, us) in cells.items():
            want = own["cells"][key]
            assert (calls, b) == (want[0], want[1]), (r, key)
            assert close(us * 1e-6, want[2]), (r, key, us, want[2])
        # per step: the heatmap's row of this rank
        for metric, k in (("calls", 0), ("bytes", 1)):
            row = page.matrix_row(f"step_{metric}", i)
            assert row == [sum(v[k] for (s, _), v in own["cells"].items() if s == step) for step in page.steps], (r, metric)
        time_row = page.matrix_row("step_time", i)
        for step, us in zip(page.steps, time_row, strict=True):
            assert close(us * 1e-6, sum(v[2] for (s, _), v in own["cells"].items() if s == step)), (r, step)
        # per op, over every step: the spread's row
        op_row = page.matrix_row("op_bytes", i)
        assert op_row == [sum(v[1] for (_, o), v in own["cells"].items() if o == op) for op in page.ops], r


def test_equal_ranks_still_share_their_blocks(tmp_path):
    """Ranks that agree are stored once (what keeps a thousand ranks' page small)."""
    folder = tmp_path / "same"
    folder.mkdir()
    dump = json.dumps(transformer_dump(layers=1, steps=2, world_size=4, rank=0, dim=64, ffn=256, vocab=256, tokens=32))
    for r in range(4):
        (folder / f"rank{r}.json").write_text(dump.replace('"rank":0', f'"rank":{r}').replace('"rank": 0', f'"rank": {r}'))
    page = Page(folder)
    assert len({e["cells"]["time_us"] for e in page.index["ranks"]}) == 1
    assert len({e["blocks"]["counts"] for e in page.index["ranks"]}) == 1
