"""One NCCL rank on one GPU: FSDP2 over four linear layers with AdamW, plus an all_reduce, an
all_gather and a reduce_scatter of fixed sizes and a 4 KiB all_reduce each step; six steps. Run by bench/gpu/check.sh
under torchrun, bare or under `commdebug run`.

  REF=FILE  time each of the four explicit collectives with CUDA events (synchronised first, as
            `--timing` does) and write {op: [seconds per step]} to FILE, for comparison with
            commdebug's latencies of the same calls
  FR=FILE   at the end, write torch's Flight Recorder dump (set TORCH_NCCL_TRACE_BUFFER_SIZE and
            TORCH_NCCL_ENABLE_TIMING=1 for durations) to FILE
  STEPS=FILE  write each step's wall time (the GPU's queue drained at each step's end) to FILE,
            as {"steps": [seconds, ...]}: bare and under `--timing events`, the timing's cost
  STEP_COUNT=N  steps (default 6)
"""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
world = dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 2048, device="cuda")
big = torch.randn(16 * 2**20, device="cuda")  # 64 MiB
tiny = torch.randn(1024, device="cuda")  # 4 KiB
shard = torch.randn(4 * 2**20, device="cuda")  # 16 MiB
gathered = torch.empty(world * shard.numel(), device="cuda")
scattered = torch.empty(big.numel() // world, device="cuda")
ref: dict[str, list[float]] = {}


def timed(op: str, fn) -> None:
    if not os.environ.get("REF"):
        fn()
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    ref.setdefault(op, []).append(start.elapsed_time(end) / 1e3)


step_times: list[float] = []
for _step in range(int(os.environ.get("STEP_COUNT", "6"))):
    began = time.perf_counter()
    model(x).sum().backward()
    timed("all_reduce", lambda: dist.all_reduce(big))
    timed("all_gather", lambda: dist.all_gather_into_tensor(gathered, shard))
    timed("reduce_scatter", lambda: dist.reduce_scatter_tensor(scattered, big))
    timed("all_reduce 4 KiB", lambda: dist.all_reduce(tiny))
    optimizer.step()
    optimizer.zero_grad()
    if os.environ.get("STEPS"):
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - began)
torch.cuda.synchronize()
if os.environ.get("STEPS"):
    Path(os.environ["STEPS"]).write_text(json.dumps({"steps": step_times}))
if os.environ.get("REF"):
    Path(os.environ["REF"]).write_text(json.dumps(ref))
if os.environ.get("FR"):
    from torch._C._distributed_c10d import _dump_nccl_trace

    Path(os.environ["FR"]).parent.mkdir(parents=True, exist_ok=True)
    Path(os.environ["FR"]).write_bytes(_dump_nccl_trace())
dist.destroy_process_group()
