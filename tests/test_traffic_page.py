"""The folder page's traffic section comes from the one read ``rank_modules`` makes: a rank file
that cannot be read is left off (the page still has the traffic of the others), and ``--ranks``
/ ``--steps`` choose the traffic's ranks and steps as they do the heatmap's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import commdebug
from commdebug import CommDebugMode
from commdebug.formats.selection import Selection
from commdebug.model.dump import to_dump_dict
from visualizer import ranks_data

RANKS = 4
STEPS = 2


def _splits(rank: int, step: int, world: int) -> tuple[int, ...]:
    """What `rank` sends each member in `step`: uneven, and its own per rank and step."""
    return tuple(16 * ((3 * rank + 5 * step + j) % 7) for j in range(world))


@pytest.fixture(scope="module")
def folder(world, tmp_path_factory) -> Path:
    """`RANKS` rank dumps of an all_to_all per step on the fake world: one real recording, each
    rank's copy given its own splits (what it sends, and what the others send it)."""
    with CommDebugMode() as comm:
        for _ in range(STEPS):
            x = torch.randn(world, 4)
            dist.all_to_all_single(torch.empty(world, 4), x)
            comm.step()
    trace = comm.trace
    out = tmp_path_factory.mktemp("a2a")
    for r in range(RANKS):
        trace.metadata["rank"] = r
        events = [e._replace(send_splits=_splits(r, e.step, world),
                             recv_splits=tuple(_splits(src, e.step, world)[r] for src in range(world)))
                  for e in trace.events]
        (out / f"rank{r}.json").write_text(json.dumps(to_dump_dict(trace, events=events)), encoding="utf-8")
    return out


def _cells(index: dict, texts: list[str]) -> dict[int, set[tuple[int, int, int, int]]]:
    """The embedded pairs per step, (src, dst, calls, bytes), of the one group."""
    traffic = index["traffic"]
    (group,), (per_step,) = traffic["groups"], json.loads(texts[traffic["block"]])
    return {step: {tuple(flat[i:i + 4]) for i in range(0, len(flat), 4)} for step, flat in zip(group["steps"], per_step, strict=True)}


def test_a_corrupt_rank_leaves_the_traffic_of_the_others(folder, tmp_path, world):
    assert comm_ops(folder) == {"all_to_all"}
    whole = _cells(*ranks_data(folder))
    assert sorted(whole) == list(range(STEPS))
    assert _rows(whole) == _peers(folder)
    broken, good = tmp_path / "broken", tmp_path / "good"
    for f in folder.iterdir():
        (broken / f.name).parent.mkdir(exist_ok=True)
        (broken / f.name).write_bytes(f.read_bytes())
        if f.name != "rank2.json":
            (good / f.name).parent.mkdir(exist_ok=True)
            (good / f.name).write_bytes(f.read_bytes())
    (broken / "rank2.json").write_text('{"format": "commdebug", "modules": [', encoding="utf-8")
    index, texts = ranks_data(broken)
    assert len(index["errors"]) == 1 and "rank2.json" in index["errors"][0]
    cells = _cells(index, texts)
    # the traffic of the ranks read: rank 2's sends are gone, what it received its senders tell
    assert _rows(cells) == _peers(good) != _rows(whole)
    assert {c[1] for step in cells.values() for c in step if c[0] == 2} == {0, 1, 3}  # no dump of 2, 4..7
    assert index["traffic"]["imbalance"]  # the imbalance of the 3 ranks read


def test_ranks_and_steps_choose_the_traffic(folder):
    index, texts = ranks_data(commdebug.rank_modules(folder, ranks=Selection.parse("1", "--ranks"), steps=Selection.parse("1", "--steps")))
    cells = _cells(index, texts)
    assert list(cells) == [1]
    # rank 1's own dump: its sends, and what each other member sent it
    assert {(c[0], c[1]) for c in cells[1]} == {(1, d) for d in range(8)} | {(s, 1) for s in range(8)}
    assert {c[3] for c in cells[1] if c[0] == 1} <= set(_splits(1, 1, 8))
    [row] = index["traffic"]["imbalance"].values()
    assert [r[0] for r in row] == [1]


def _rows(cells: dict[int, set[tuple[int, int, int, int]]]) -> set[tuple[int, ...]]:
    return {(step, *c) for step, pairs in cells.items() for c in pairs}


def _peers(folder: Path) -> set[tuple[int, ...]]:
    """``summary --by peer`` per step, read on its own."""
    return {(r.step, r.src, r.dst, r.calls, r.bytes) for r in commdebug.traffic_path(folder, by_step=True).peers}


def comm_ops(folder: Path) -> set[str]:
    return {e.op for e in commdebug.load(folder / "rank0.json").events}
