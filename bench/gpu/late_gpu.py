"""Four gloo ranks sharing one GPU, their tensors on it; rank LATE_RANK is late on the GPU, not
on the host, at step LATE_STEP: it queues about LATE_S seconds of bf16 matrix products before its
all_reduce and goes on at once, so its host gap is short while the others wait on the GPU's
work. Run by bench/gpu/check.sh under `commdebug run --timing --profile-steps`.
"""

import os

import torch
import torch.distributed as dist

late_rank = int(os.environ.get("LATE_RANK", "3"))
late_step = int(os.environ.get("LATE_STEP", "2"))
late_s = float(os.environ.get("LATE_S", "0.8"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.cuda.set_device(0)
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024, device="cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 1024, device="cuda")
if rank == late_rank:  # how many products make LATE_S on this GPU
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.mm(a, a)
    start.record()
    for _ in range(20):
        torch.mm(a, a)
    end.record()
    end.synchronize()
    n = max(1, round(late_s / (start.elapsed_time(end) / 1e3 / 20)))
    print(f"rank {rank}: {n} products for {late_s} s", flush=True)
for step in range(5):
    model(x).sum().backward()
    dist.barrier()
    if rank == late_rank and step == late_step:
        for _ in range(n):
            torch.mm(a, a)  # queued; the host goes on at once
    dist.all_reduce(model.weight.grad)  # the others wait for it here
    optimizer.step()
    optimizer.zero_grad()
torch.cuda.synchronize()
dist.destroy_process_group()
