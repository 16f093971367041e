"""Two gloo ranks that end badly, one way per CRASH_MODE, for the tests of how a rank's ending is
told (tests/test_crash_endings.py; the recorded folders in tests/data/crash_gloo/).

Each step: an all_to_all_single (abort mode only), a forward and backward, then an all_reduce of
a gradient, an all_gather of it and a barrier, then the optimizer's step. At step 2 (abort: step 1):

- ``skip``: rank 1 skips the all_reduce, so its all_gather meets rank 0's all_reduce and both
  time out (CRASH_TIMEOUT s, default 6) in those calls: rank 1 never reaches the barrier;
- ``exception``: rank 1's batch loader raises ValueError (RAISE_LINE);
- ``abort``: rank 1 sends 3 elements where rank 0 expects 2 in the all_to_all: gloo aborts rank 0
  (SIGABRT, "Received data size doesn't match expected size") inside the call (A2A_LINE);
- ``kill``: rank 1 kills itself with SIGKILL as the step starts.

    torchrun --nproc-per-node 2 -m commdebug run --out traces -- crash_job.py   (CRASH_MODE=skip)
"""

import datetime
import os
import signal

import torch
import torch.distributed as dist

MODE = os.environ.get("CRASH_MODE", "skip")
AT = 1 if MODE == "abort" else 2


def load_batch(step, rank):
    if step == AT and rank == 1:
        if MODE == "exception":
            raise ValueError(f"bad batch on rank 1 at step {step}")  # RAISE_LINE
        if MODE == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    return torch.ones(16, 8)


def exchange(step, rank):
    send = [3, 2] if (step == AT and rank == 1) else [2, 2]
    out = torch.empty(4)
    dist.all_to_all_single(out, torch.ones(sum(send)), [2, 2], send)  # A2A_LINE


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("CRASH_TIMEOUT", "6"))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        batch = load_batch(step, rank)
        if MODE == "abort":
            exchange(step, rank)
        model(batch).sum().backward()
        grad = model.weight.grad
        if not (MODE == "skip" and step == AT and rank == 1):
            dist.all_reduce(grad)  # ALL_REDUCE_LINE
        out = [torch.empty_like(grad) for _ in range(2)]
        dist.all_gather(out, grad)  # ALL_GATHER_LINE
        dist.barrier()  # BARRIER_LINE
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


main()
