"""An expert-parallel MoE layer's token traffic, as real implementations issue it: per step, an
all_to_all of the token counts, then the tokens with uneven splits taken from those counts
(dispatch), then back with the splits swapped (combine). Step 0 uses eager c10d
(``dist.all_to_all_single``), step 1 the autograd functional form, with a backward (whose
all_to_alls swap the splits again).

    python moe_job.py OUT                           gloo: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the env
    python moe_job.py OUT --fake RANK WORLD [--bad SRC:DST]
                                                    torch's fake backend, this process playing rank RANK;
                                                    --bad: in step 1's dispatch rank DST expects one token
                                                    more from SRC than SRC sends (a split bookkeeping bug)

Rank r sends ``rows(r, j, step)`` tokens of ``HIDDEN`` float32 to rank j. Writes
OUT/rank<r>.json (the dump), prints ``passed {...}`` (every split list this rank passed, in
tokens, with a token's bytes) and then ``moe job done rank <r>`` as its last line.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from commdebug import CommDebugMode

HIDDEN = 4
TOKEN_BYTES = HIDDEN * 4


def rows(src: int, dst: int, step: int) -> int:
    return (3 * src + 5 * dst + 2 * step) % 7


def main() -> None:
    out = sys.argv[1]
    fake = "--fake" in sys.argv
    bad = None
    if fake:
        at = sys.argv.index("--fake")
        rank, world = int(sys.argv[at + 1]), int(sys.argv[at + 2])
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        if "--bad" in sys.argv:
            src, dst = sys.argv[sys.argv.index("--bad") + 1].split(":")
            bad = (int(src), int(dst))
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    passed: list[dict] = []

    def exchange(step: int, functional: bool) -> tuple[list[int], list[int]]:
        send = [rows(rank, j, step) for j in range(world)]
        counts = torch.tensor(send, dtype=torch.int64)
        if functional:
            got = fc.wait_tensor(fc.all_to_all_single(counts, None, None, dist.group.WORLD))
        else:
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts)
        recv = [rows(j, rank, step) for j in range(world)]
        if not fake:  # the fake backend fills in nothing: there the counts are known by formula
            assert got.tolist() == recv, (got.tolist(), recv)
        if bad is not None and step == 1 and rank == bad[1]:
            recv[bad[0]] += 1
        return send, recv

    with CommDebugMode() as comm:
        for step in range(2):
            functional = step == 1
            send, recv = exchange(step, functional)
            tokens = torch.randn(sum(send), HIDDEN, requires_grad=functional)
            passed.append({"step": step, "input_split_sizes": send, "output_split_sizes": recv})
            passed.append({"step": step, "input_split_sizes": recv, "output_split_sizes": send})
            if functional:
                got = fc.all_to_all_single_autograd(tokens, recv, send, dist.group.WORLD)
                back = fc.all_to_all_single_autograd(got * 2, send, recv, dist.group.WORLD)
                fc.wait_tensor(back).sum().backward()  # backward: both all_to_alls again, splits swapped
                passed.append({"step": step, "input_split_sizes": send, "output_split_sizes": recv, "backward": True})
                passed.append({"step": step, "input_split_sizes": recv, "output_split_sizes": send, "backward": True})
            else:
                got = torch.empty(sum(recv), HIDDEN)
                dist.all_to_all_single(got, tokens, output_split_sizes=recv, input_split_sizes=send)
                back = torch.empty(sum(send), HIDDEN)
                dist.all_to_all_single(back, got * 2, output_split_sizes=send, input_split_sizes=recv)
            comm.step()
    comm.generate_json_dump(os.path.join(out, f"rank{rank}.json"))
    print("passed " + json.dumps({"rank": rank, "world": world, "token_bytes": TOKEN_BYTES, "counts_bytes": 8, "calls": passed}))
    print(f"moe job done rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
