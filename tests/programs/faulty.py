"""One gloo rank (a world of 1) that dies of SIGABRT, for the fault record tests.

    python faulty.py [STREAM_FILE] [after] [overflow]

It records one all_reduce; with STREAM_FILE (the rank's stream under `commdebug run`) it waits
until the stream holds that call, without marking a step (so the rank's record keeps the pid name it
got before the rank was known); with ``after`` it enables faulthandler itself, to stderr, as
torch's elastic ``@record`` and torchtitan's trainer do once the program runs. Then it aborts;
with ``overflow`` it first overflows its C stack (a SIGSEGV where no stack is left to run a
handler on, but an alternate one).
"""

import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist


def free_port() -> int:
    # bench/ports.py is the one way to find free ports (it keeps to the test worker's own range)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    from ports import free_port as pick

    return pick()


def crash() -> None:
    if "overflow" in sys.argv:  # the C stack overflows (no Python frame limit): a SIGSEGV with no stack left
        sys.setrecursionlimit(10**8)
        nested: list = []
        for _ in range(10**6):
            nested = [nested]
        repr(nested)  # OVERFLOW_LINE
    os.abort()  # ABORT_LINE


os.environ["MASTER_ADDR"] = "127.0.0.1"
os.environ["MASTER_PORT"] = str(free_port())
dist.init_process_group("gloo", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
stream = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] not in ("after", "overflow") else None
deadline = time.monotonic() + 60


def streamed(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return b'"kind":"chunk"' in f.read()
    except OSError:
        return False


while stream and not streamed(stream) and time.monotonic() < deadline:
    time.sleep(0.05)
if "after" in sys.argv:
    faulthandler.enable(all_threads=True)
crash()
