"""GPU readiness: every CUDA path of commdebug's capture and timing, on NCCL, in one run.

    python bench/gpu_check.py            # one rank; two more where two GPUs exist

Paths exercised (commdebug/capture/timing.py, docs/configuration.md):

1. timing="sync": CUDA events around each collective (SyncTimer on CUDA tensors);
2. timing="async": NCCL's own kernel timings through its completion hook, without waiting
   (COMMDEBUG_NCCL_COMPLETION_HOOK=1; run in its own process, since the hook has aborted
   communicators on some torch/NCCL versions: a failure is reported, not fatal);
3. nvtx=True: an NVTX range per collective;
4. light=True: light capture (no dispatch mode);
5. a torch.compile'd block issuing a functional all_reduce (events marked compiled).

Each path prints what it recorded (calls, ops, bytes) and what it measured (timed calls,
latency range, busbw). Without CUDA it says so in one line and exits 0. Meant to finish well
under 4 minutes on one GPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SIZES = (4 << 10, 256 << 10, 16 << 20)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(name: str, comm, seconds: float) -> str:
    events = comm.trace.events
    timed = [e.latency_s for e in events if e.latency_s]
    ops = sorted({e.op for e in events})
    compiled = sum(e.compiled for e in events)
    line = (f"{name}: {len(events)} calls ({', '.join(ops) or 'none'}), {sum(e.size_bytes for e in events)} bytes,"
            f" {len(timed)} timed")
    if timed:
        busbw = [e.busbw_gbps for e in events if e.latency_s and e.size_bytes]
        line += f", latency {min(timed) * 1e6:.1f}-{max(timed) * 1e6:.1f} us, best busbw {max(busbw or [0]):.1f} GB/s"
    if compiled:
        line += f", {compiled} from compiled code"
    return line + f" ({seconds:.1f} s)"


def _paths(rank: int, world: int, only: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from commdebug import CommDebugMode

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    bufs = [torch.ones(s // 4, device=device) for s in SIZES]

    def loop() -> None:
        for _ in range(3):
            for b in bufs:
                dist.all_reduce(b)
            out = torch.empty(bufs[1].numel() * world, device=device)
            dist.all_gather_into_tensor(out, bufs[1])
            dist.reduce_scatter_tensor(torch.empty(bufs[1].numel() // world, device=device), bufs[1])
        torch.cuda.synchronize()

    loop()  # communicators set up before anything is timed
    runs = {"sync timing (CUDA events)": dict(timing="sync"), "async timing (NCCL's own)": dict(timing="async"),
            "NVTX ranges": dict(nvtx=True, timing="sync"), "light capture": dict(light=True, timing="sync")}
    for name, options in runs.items():
        if (only == "async") != (options.get("timing") == "async"):
            continue
        start = time.perf_counter()
        comm = CommDebugMode(**options)
        with comm:
            loop()
            if options.get("timing") == "async":
                comm.step()  # joins NCCL's reported durations
        if rank == 0:
            print(_describe(name, comm, time.perf_counter() - start), flush=True)
    if only != "async":
        group = dist.group.WORLD

        @torch.compile(fullgraph=True)
        def block(x):
            return funcol.all_reduce(x * 2, "sum", group) + 1

        start = time.perf_counter()
        comm = CommDebugMode(timing="sync")
        with comm:
            for b in bufs:
                block(b)
            torch.cuda.synchronize()
        if rank == 0:
            print(_describe("compiled block", comm, time.perf_counter() - start), flush=True)


def worker(rank: int, world: int, port: int, only: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=None)
    try:
        _paths(rank, world, only)
    finally:
        dist.destroy_process_group()


def _run_world(world: int, only: str, timeout: int) -> int:
    """One world in a fresh process tree (a hook that aborts NCCL takes only that run down)."""
    env = dict(os.environ, COMMDEBUG_NCCL_COMPLETION_HOOK="1" if only == "async" else os.environ.get("COMMDEBUG_NCCL_COMPLETION_HOOK", ""))
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import torch.multiprocessing as mp; from bench.gpu_check import worker, _port;"
            f" mp.start_processes(worker, args=({world}, _port(), {only!r}), nprocs={world}, join=True, start_method='spawn')")
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        print(f"  {only} on {world} rank(s): did not finish in {timeout} s")
        return 1
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {only} on {world} rank(s) FAILED (exit {proc.returncode}): {tail}")
    return proc.returncode


def main() -> int:
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed: nothing to check")
        return 0
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        print(f"gpu_check: no CUDA GPU with NCCL here (torch {torch.__version__}): nothing to check")
        return 0
    n = torch.cuda.device_count()
    print(f"gpu_check: torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} GPU(s): {torch.cuda.get_device_name(0)}")
    failed = 0
    for world in sorted({1, min(n, 2)}):
        print(f"--- {world} rank(s) on NCCL")
        for only in ("main", "async"):  # the completion hook in a process of its own
            failed += _run_world(world, only, timeout=100) != 0
    print(f"gpu_check: {'all paths ran' if not failed else f'{failed} path run(s) failed'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
