"""Real PyTorch Flight Recorder dumps of a 2-rank gloo job: the fixtures under tests/data/fr_gloo.

    .venv/bin/python tests/programs/make_fr_dumps.py [OUT]     (default tests/data/fr_gloo; ~10 s)

Each rank runs all_reduce, broadcast, send/recv, all_gather and a barrier, then writes what
Flight Recorder holds: ``OUT/pickle/fr_trace_<rank>`` (``_dump_fr_trace()``, with frames) and
``OUT/json/fr_trace_<rank>.json`` (``_dump_fr_trace_json()``, no frames). On gloo, torch 2.13
records without any environment variable. Two things are changed from what torch writes, so the
files are small and the same on every machine: frame file names lose the repository's prefix
(``tests/programs/make_fr_dumps.py``), and each entry keeps its frames only down to the first one
in this script (frames are innermost first: torch's, then ours).

tests/test_verdicts.py edits copies of these to model the cases it needs (a rank whose dump
lags by one completion, a rank that never issued the last collective).

Bounded: the process group times out after 30 s, and the whole job is killed after 120 s.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2
DEADLINE_S = 120


def job(rank: int) -> None:
    """The collectives each rank issues; the line numbers end up in the dumps' frames."""
    t = torch.ones(16)
    dist.all_reduce(t)
    dist.broadcast(torch.ones(8), src=0)
    if rank == 0:
        dist.send(torch.ones(4), 1)
    else:
        dist.recv(torch.empty(4), 0)
    dist.all_gather_into_tensor(torch.empty(4 * WORLD), torch.ones(4))
    dist.barrier()


def _relative(name: str) -> str:
    prefix = str(ROOT) + os.sep
    return name[len(prefix):] if name.startswith(prefix) else name


def _shrink(data: dict) -> dict:
    """The dump with repository-relative frame file names, each entry's frames cut after the
    first one in this script (what commdebug reads as the source line)."""
    here = _relative(__file__)
    for entry in data.get("entries", []):
        frames = entry.get("frames")
        if isinstance(frames, list):
            kept = [{**f, "filename": _relative(str(f.get("filename")))} for f in frames]
            mine = next((i for i, f in enumerate(kept) if f["filename"] == here), len(kept) - 1)
            entry["frames"] = kept[: mine + 1]
    return data


def _settled(timeout_s: float = 10.0) -> dict:
    """This rank's dump once every enqueued op reads completed.

    gloo marks an op completed on its worker thread after the caller has been released, so a
    dump taken at once can still show the last barrier unfinished (the completion race that
    tests/test_verdicts.py models by editing a copy). The fixtures start from the settled state."""
    deadline = time.monotonic() + timeout_s
    while True:
        data = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
        status = data.get("pg_status", {}).values()
        if all(s["last_completed_collective"] == s["last_enqueued_collective"] for s in status) or time.monotonic() > deadline:
            return data
        time.sleep(0.01)


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    try:
        job(rank)
        data = _shrink(_settled())
        as_json = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
        for sub in ("pickle", "json"):
            os.makedirs(os.path.join(out, sub), exist_ok=True)
        with open(os.path.join(out, "pickle", f"fr_trace_{rank}"), "wb") as f:
            pickle.dump(data, f)
        with open(os.path.join(out, "json", f"fr_trace_{rank}.json"), "w") as f:
            json.dump(as_json, f, indent=1, sort_keys=True)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(out: str) -> int:
    ctx = mp.spawn(worker, args=(_free_port(), out), nprocs=WORLD, join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:  # a stuck rank must not hang the caller
            for p in ctx.processes:
                p.kill()
            print(f"make_fr_dumps: killed after {DEADLINE_S} s", file=sys.stderr)
            return 1
    print(f"wrote {out}/pickle and {out}/json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "tests" / "data" / "fr_gloo")))
