"""Ranks meeting at collectives, simulated: what a timed recording of a job would hold, with the
waits where real ranks have them, for the late-rank tests (no processes spawned).

Every rank runs the same steps; a step is a list of :class:`Slot` (one collective each: which
group each rank calls it on, its op and source line). Before each call a rank works a little
(``work``, plus anything in ``delays``); a group's call ends when its last member arrived plus the
transfer time, and each member's latency is from its own arrival to that end (so the members
that came early hold the wait). A broadcast (rooted at the group's first member) meets nobody:
its root ends on its own, a receiver once both it and the root arrived, as gloo's small
broadcasts do. Each rank's process starts at its own moment (``starts``), and
its recording clock counts from there, as `commdebug run` records it: clocks are not shared.

>>> views = simulate(pair_then_world(), ranks=4, steps=6, delays={(3, 3, 0): 0.5})   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import pathlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from commdebug.model.dump import dump_text
from commdebug.model.rank_view import RankView, trace_of_view
from commdebug.model.trace import CollectiveEvent, GroupInfo

__all__ = ["Slot", "simulate", "pair_then_world", "world_only", "write_views", "SOURCE"]

SOURCE = "job.py"
WORLD = "0"


@dataclass(frozen=True)
class Slot:
    """One collective of a step: the group each rank calls it on (by rank), its op, its line."""

    group_of: Callable[[int], GroupInfo]
    op: str
    line: int


def world_group(ranks: int) -> GroupInfo:
    return GroupInfo(WORLD, "default_pg", ranks, tuple(range(ranks)))


def world_only(ranks: int, calls: int = 2) -> list[Slot]:
    """A balanced data-parallel step: `calls` all_reduces on the world group."""
    world = world_group(ranks)
    return [Slot(lambda r: world, "all_reduce", 20 + k) for k in range(calls)]


def pair_then_world(ranks: int = 4) -> list[Slot]:
    """Per step an all_reduce on each rank's pair group ({0,1}, {2,3}, ...), then one on the world."""
    pairs = [GroupInfo(str(1 + p), "", 2, (2 * p, 2 * p + 1)) for p in range(ranks // 2)]
    world = world_group(ranks)
    return [Slot(lambda r: pairs[r // 2], "all_reduce", 24), Slot(lambda r: world, "all_reduce", 25)]


def simulate(step: list[Slot], ranks: int, steps: int, *, starts: dict[int, float] | None = None,
             delays: dict[tuple[int, int, int], float] | None = None, work: float = 1e-3, transfer: float = 1e-4,
             seed: int = 0, first_index: int = 0, prelude: Sequence[Slot] = ()) -> list[RankView]:
    """Each rank's view of the job (see the module docstring). `starts`: rank -> when its process
    started (seconds; default 0); `delays`: (rank, step, slot) -> extra work before that call;
    `work` and `transfer`: per call, each varied by up to 5% per rank and call (seed `seed`);
    `first_index`: the first event's index (more than 0: the events before were dropped);
    `prelude`: calls made once, in step 0 before its slots (a model's parameters broadcast)."""
    rng = random.Random(seed)
    starts = starts or {}
    delays = delays or {}
    now = {r: starts.get(r, 0.0) for r in range(ranks)}  # each rank's global time
    seqs: dict[str, int] = {}
    events: dict[int, list[CollectiveEvent]] = {r: [] for r in range(ranks)}
    plan = [(0, -1 - k, slot) for k, slot in enumerate(prelude)] + [(s, k, slot) for s in range(steps) for k, slot in enumerate(step)]
    for s, k, slot in plan:
        calls: dict[GroupInfo, list[int]] = {}
        for r in range(ranks):
            calls.setdefault(slot.group_of(r), []).append(r)
        for group, members in calls.items():
            seq = seqs.get(group.name, 0)
            seqs[group.name] = seq + 1
            arrive = {r: now[r] + work * rng.uniform(0.95, 1.05) + delays.get((r, s, k), 0.0) for r in members}
            moved = transfer * rng.uniform(0.95, 1.05)
            for r in members:
                # a broadcast's member goes once it and the root came; any other call once all came
                end = (max(arrive[r], arrive[members[0]]) if slot.op == "broadcast" else max(arrive.values())) + moved
                events[r].append(_event(first_index + len(events[r]), slot, s, group, seq, arrive[r] - starts.get(r, 0.0),
                                        end - arrive[r]))
                now[r] = end
    return [RankView(r, pathlib.Path(f"rank{r}.json"), _metadata(r, ranks), {e.group.name: e.group for e in events[r]}, events[r])
            for r in range(ranks)]


def _metadata(rank: int, ranks: int) -> dict[str, Any]:
    return {"rank": rank, "world_size": ranks, "hostname": "sim", "timing": "sync", "backend": "gloo", "ended_by": "exit"}


def _event(index: int, slot: Slot, step: int, group: GroupInfo, seq: int, start: float, latency: float) -> CollectiveEvent:
    return CollectiveEvent(index=index, op=slot.op, key=f"c10d.{slot.op}_", aten_op=f"c10d.{slot.op}_.default", step=step,
                           phase="forward", module="Global", group=group, seq=seq, dtype="float32", input_shapes=((64,),),
                           output_shapes=((64,),), input_bytes=256, output_bytes=256, size_bytes=256,
                           busbw_factor=2 * (group.size - 1) / group.size, source=f"{SOURCE}:{slot.line}",
                           latency_s=latency, start_s=round(start, 9))


def write_views(views: list[RankView], folder: str | os.PathLike[str]) -> pathlib.Path:
    """The views as a folder of rank dumps, as `commdebug run` writes them."""
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for v in views:
        trace = trace_of_view(v)
        text = dump_text(trace)
        data = json.loads(text)
        (out / f"rank{v.rank}.json").write_text(json.dumps(data), encoding="utf-8")
    return out
