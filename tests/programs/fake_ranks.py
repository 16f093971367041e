"""Per-rank dumps of a rank-dependent program without real processes: this one process plays
rank r of N on torch's fake backend, for r = 0..N-1, and writes OUT/rank{rank}.json each time.

    python fake_ranks.py OUT SCENARIO[,SCENARIO...] [WORLD]     (writes OUT/SCENARIO/rank<r>.json)

SCENARIO: ok | skip (rank 3 skips the second all_reduce) | size (rank 2's all_reduce is twice
as big) | p2p (rank 1 never receives rank 0's second send) | timed (latencies made up per rank,
rank 2 arriving late, for the report's straggler pairing) | same (every member of a call took
the same made-up latency: no rank waited, straggler time exactly 0)
"""

import random
import sys
import warnings

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from commdebug import CommDebugMode

warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's deprecation

out, scenarios = sys.argv[1], sys.argv[2].split(",")
world = int(sys.argv[3]) if len(sys.argv) > 3 else 4

for scenario, rank in ((s, r) for s in scenarios for r in range(world)):
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    comm = CommDebugMode()
    with comm:
        for step in range(20 if scenario == "same" else 2):
            n = 2048 if scenario == "size" and rank == 2 and step == 1 else 1024
            dist.all_reduce(torch.ones(n))
            if rank % 2 == 0:
                dist.all_gather_into_tensor(torch.empty(8 * (world // 2)), torch.ones(8), group=evens)
            if not (scenario == "skip" and rank == 3 and step == 1):
                dist.all_reduce(torch.ones(16))
            if rank == 0:
                dist.send(torch.ones(4), 1)
            elif rank == 1 and not (scenario == "p2p" and step == 1):
                dist.recv(torch.empty(4), 0)
            comm.step()
    if scenario == "timed":  # rank 2 arrives 5 ms late at every collective: the others wait
        trace = comm.trace
        for e in list(trace.events):
            if e.seq is not None:
                trace.update_event(e.index, latency_s=0.001 if rank == 2 else 0.006)
    if scenario == "same":  # tenths, which no binary float holds exactly: sums that should cancel
        trace = comm.trace
        for e in list(trace.events):
            if e.seq is not None:
                pick = random.Random(f"0:{e.group.size}:{e.seq}")  # the same on every member of the call
                trace.update_event(e.index, latency_s=pick.choice([0.1, 0.2, 0.3, 0.7, 1.1, 0.01, 0.003]) * pick.randint(1, 9))
    comm.generate_json_dump(f"{out}/{scenario}/rank{{rank}}.json")
    dist.destroy_process_group()
