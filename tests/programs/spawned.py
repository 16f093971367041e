"""Ranks started the way PyTorch's DDP tutorial starts them: the parent never initialises a
process group; ``torch.multiprocessing.spawn`` starts fresh interpreters that do, each with
``init_process_group("gloo", rank=r, world_size=2)`` and MASTER_ADDR/MASTER_PORT from the
environment.

    python spawned.py [MODE]

MODE: ``spawn`` (2 spawned ranks, the default), ``solo`` (this process alone, a world of 1),
``none`` (never touches torch.distributed), ``quiet`` (a world of 1 that initialises
torch.distributed and destroys its process group without a collective); with ``-abort`` appended (``spawn-abort``,
``solo-abort``) every rank aborts (SIGABRT) in its interpreter's teardown after the program has
finished, as torch 2.13's gloo teardown sometimes does; with ``-exit`` (``solo-exit``) it leaves
with ``os._exit(0)``, past the teardown, after a child it forks has left with ``os._exit(7)``.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class AbortAtTeardown:
    """Aborts the process when the interpreter frees it: in teardown, after every exit handler."""

    def __del__(self, abort=os.abort):
        abort()


def abort_at_teardown() -> None:
    # a module is freed only in interpreter teardown, after the atexit handlers have run
    keeper = type(sys)("spawned_abort_keeper")
    keeper.keep = AbortAtTeardown()
    sys.modules[keeper.__name__] = keeper


def work(rank: int, world: int, ending: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.all_reduce(torch.ones(4) * rank)
    dist.broadcast(torch.ones(8), src=0)
    dist.barrier()
    dist.destroy_process_group()
    if ending == "abort":
        abort_at_teardown()
    if ending == "exit":
        child = os.fork()
        if child == 0:
            os._exit(7)  # a forked helper leaving: its parent's recording is not its to write
        os.waitpid(child, 0)
        dumps = [name for name in os.listdir(os.environ.get("SPAWNED_OUT", ".")) if name.endswith(".json")]
        print(f"dumps after the child left: {dumps}", flush=True)
        os._exit(0)


def free_port() -> int:
    # bench/ports.py is the one way to find free ports (it keeps to the test worker's own range)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    from ports import free_port as pick

    return pick()


if __name__ == "__main__":
    mode, _, ending = (sys.argv[1] if len(sys.argv) > 1 else "spawn").partition("-")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    if mode == "spawn":
        mp.spawn(work, args=(2, ending), nprocs=2, join=True)
    elif mode == "solo":
        work(0, 1, ending)
    elif mode == "quiet":
        dist.init_process_group("gloo", rank=0, world_size=1)
        print(f"a world of {dist.get_world_size()}, no collective")
        dist.destroy_process_group()
    else:
        print(f"no torch.distributed here: {torch.ones(2).sum().item()}")
