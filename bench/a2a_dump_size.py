"""Dump bytes per event of a 1,024-rank all_to_all-heavy job, with and without the splits.

Every rank's dump is built through the real dump writer (``to_dump_dict`` and the by-column
event block) from events shaped like an expert-parallel MoE step: an all_to_all of the token
counts (int64 per member: even splits), the token dispatch (uneven: each rank routes its
tokens to the members by a per-(rank, step) random routing), the combine (the dispatch's
splits swapped), and two gradient all_reduces. The dumps are serialised as ``commdebug run``
writes them (compact JSON) and measured, not written to disk. Printed per layout of the
expert-parallel group (all 1,024 ranks in one group, or groups of 64):

- bytes per event without splits (as every dump was before they were kept),
- with them, as stored (even splits as a marker, each distinct vector once, as
  ``[unit, k0, k1, ...]``), and the split data's own share,
- with them stored naively (each event's two vectors as plain lists of bytes), for scale.

With ``--write DIR``, also writes each layout's folder (with splits) to DIR/ep<N>/, for timing
``commdebug check`` and ``summary --by peer`` on it.

    python bench/a2a_dump_size.py [--ranks 1024] [--steps 8] [--ep 1024,64] [--write DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from array import array
from functools import cache
from pathlib import Path

from commdebug import ops as _ops
from commdebug.model.dump import to_dump_dict
from commdebug.model.trace import CollectiveEvent, GroupInfo, Trace

TOKEN_BYTES = 4096 * 2  # hidden 4096, bfloat16
TOKENS = 4096 * 2  # tokens per rank and step, top-2 routing


@cache
def _routing(rank: int, step: int, n: int) -> array:
    """How many of ``rank``'s tokens go to each member at ``step`` (skewed, some zero)."""
    rng = random.Random(rank * 1_000_003 + step)
    weights = [rng.random() ** 3 for _ in range(n)]
    total = sum(weights)
    counts = [int(TOKENS * w / total) for w in weights]
    counts[rng.randrange(n)] += TOKENS - sum(counts)
    return array("i", counts)


def _events(rank: int, world: int, ep: int, steps: int, splits: bool) -> list[CollectiveEvent]:
    first = rank - rank % ep
    members = tuple(range(first, first + ep))
    group = GroupInfo(f"ep{first // ep}", "mesh_ep", ep, members)
    world_group = GroupInfo("0", "default_pg", world, tuple(range(world)))
    a2a = _ops.spec_for_op("all_to_all")
    ar = _ops.spec_for_op("all_reduce")
    assert a2a is not None and ar is not None
    out: list[CollectiveEvent] = []
    seq = {group.name: 0, world_group.name: 0}

    def add(op: str, key: str, g: GroupInfo, inb: int, outb: int, send: tuple[int, ...] | None, recv: tuple[int, ...] | None,
            step: int, line: int, factor: float) -> None:
        out.append(CollectiveEvent(len(out), op, key, key + ".default", step, "forward", "model.layers.3.moe", g, seq[g.name],
                                   "bfloat16", ((inb // 2,),), ((outb // 2,),), inb, outb, inb, factor,
                                   source=f"moe.py:{line}", latency_s=1e-3, start_s=len(out) * 1e-3,
                                   send_splits=send if splits else None, recv_splits=recv if splits else None))
        seq[g.name] += 1

    me = members.index(rank)
    for step in range(steps):
        sent = tuple(c * TOKEN_BYTES for c in _routing(rank, step, ep))
        got = tuple(_routing(src, step, ep)[me] * TOKEN_BYTES for src in members)
        key = "_c10d_functional.all_to_all_single"
        add("all_to_all", key, group, 8 * ep, 8 * ep, (8,) * ep, (8,) * ep, step, 40, a2a.busbw_factor(ep))
        add("all_to_all", key, group, sum(sent), sum(got), sent, got, step, 41, a2a.busbw_factor(ep))
        add("all_to_all", key, group, sum(got), sum(sent), got, sent, step, 44, a2a.busbw_factor(ep))
        for line in (70, 71):
            add("all_reduce", "c10d.allreduce_", world_group, 1 << 22, 1 << 22, None, None, step, line, ar.busbw_factor(world))
    return out


def _dump_bytes(rank: int, world: int, ep: int, steps: int, splits: bool, write: Path | None = None) -> tuple[int, int, int]:
    """(dump bytes, events, bytes of the events' split vectors as plain lists); ``write``: the
    folder to write the dump to as well."""
    trace = Trace()
    events = _events(rank, world, ep, steps, splits)
    for e in events:
        trace.add_group(e.group)
        trace.add_event(e)
    trace.metadata.update({"rank": rank, "world_size": world, "backend": "nccl", "hostname": f"node{rank // 8}"})
    text = json.dumps(to_dump_dict(trace, noise_level=0), separators=(",", ":"))
    if write is not None:
        write.mkdir(parents=True, exist_ok=True)
        (write / f"rank{rank}.json").write_text(text)
    naive = sum(len(json.dumps(list(v), separators=(",", ":"))) for e in events for v in (e.send_splits, e.recv_splits) if v is not None)
    return len(text), len(events), naive


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--ep", default="1024,64", help="expert-parallel group sizes to try (comma-separated)")
    ap.add_argument("--write", type=Path, default=None, help="also write each layout's folder (with splits) under this folder")
    args = ap.parse_args()
    print(f"{args.ranks} ranks, {args.steps} steps of: all_to_all of counts (even), dispatch and combine (uneven), 2 all_reduce")
    for ep in (int(x) for x in args.ep.split(",")):
        t0 = time.perf_counter()
        plain = with_splits = events = naive = 0
        for rank in range(args.ranks):
            b0, n, _ = _dump_bytes(rank, args.ranks, ep, args.steps, False)
            b1, _, raw = _dump_bytes(rank, args.ranks, ep, args.steps, True, None if args.write is None else args.write / f"ep{ep}")
            plain, with_splits, events, naive = plain + b0, with_splits + b1, events + n, naive + raw
        a2a_events = events * 3 // 5
        print(f"expert-parallel groups of {ep}: {events} events in all ({a2a_events} all_to_all), {time.perf_counter() - t0:.0f} s")
        print(f"  without splits:          {plain / events:9.0f} B/event   folder {plain / 2**20:8.1f} MiB")
        print(f"  with splits, as stored:  {with_splits / events:9.0f} B/event   folder {with_splits / 2**20:8.1f} MiB"
              f"   (split data {(with_splits - plain) / a2a_events:.0f} B per all_to_all)")
        print(f"  splits as plain lists:   {(plain + naive) / events:9.0f} B/event   folder {(plain + naive) / 2**20:8.1f} MiB"
              f"   (split data {naive / a2a_events:.0f} B per all_to_all; as stored = {(with_splits - plain) / max(naive, 1):.2f} x)")


if __name__ == "__main__":
    main()
