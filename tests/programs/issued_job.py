"""A job that dies right after issuing a collective, for tests/test_issued.py.

    ISSUED_BAD=kill    one gloo rank (a world of 1, no launcher needed): step 0 all_reduces its
                       two gradients; step 1 all_reduces them again, issues a third all_reduce
                       with async_op=True and SIGKILLs itself before waiting for it
    ISSUED_BAD=unmatched  two gloo ranks under torchrun: in step 1 rank 1 issues an all_reduce
                       with async_op=True that rank 0 never issues, and SIGKILLs itself before
                       waiting for it; rank 0 goes on to step 2
    ISSUED_BAD=uneven  two gloo ranks under torchrun: step 1 ends with an all_to_all_single whose
                       splits disagree (rank 1 sends 6 rows to rank 0, which expects 4); gloo
                       aborts rank 0 in native code (SIGABRT: "Received data size doesn't match
                       expected size") while the call is in flight
"""

import os
import signal
import sys

import torch
import torch.distributed as dist

bad = os.environ.get("ISSUED_BAD", "")
if "RANK" not in os.environ:  # run alone, without a launcher
    # bench/ports.py is the one way to find free ports (it keeps to the test worker's own range)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    from ports import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    model(torch.ones(4, 8)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # GRAD_ALL_REDUCE
    if step == 1 and bad == "kill":
        work = dist.all_reduce(torch.ones(16), async_op=True)  # ASYNC_ALL_REDUCE
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 1 and bad == "unmatched" and rank == 1:
        work = dist.all_reduce(torch.ones(16), async_op=True)  # UNMATCHED_ALL_REDUCE
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 1 and bad == "uneven":
        rows = 8 if rank == 0 else 10
        dist.all_to_all_single(torch.empty(8), torch.ones(rows), [4, 4], [4, 4] if rank == 0 else [6, 4])  # UNEVEN_ALL_TO_ALL
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
