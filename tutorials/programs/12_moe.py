"""An expert-parallel Mixture-of-Experts layer, as MoE implementations write it: a router picks
each token's top-k experts; experts live EXPERTS_PER_RANK to a rank; each step the ranks first
exchange how many tokens each expert gets (an all_to_all of counts), then dispatch the tokens
with uneven splits taken from those counts, run their experts, and combine the results back (the
splits swapped). Dispatch and combine use the autograd functional all_to_all, so the backward
moves the gradients the same way again. Nothing here knows about imbalance or checking: it only
records a dump with ``CommDebugMode``.

    python 12_moe.py OUT --router balanced|skewed [--steps N]
        gloo: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the env (what torchrun sets)
    python 12_moe.py OUT --router R --fake RANK WORLD [--bug]
        torch's fake backend, this process playing rank RANK (nothing is exchanged: each rank
        computes the counts its peers would send it from their seeds); --bug plants a split
        bookkeeping bug: in step 1 rank 0 skips the count exchange's result and expects from
        each peer what it sends to that peer

Writes OUT/rank<r>.json, prints ``routed {...}`` (the tokens this rank received per step) and
``moe done rank <r>`` as its last line.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from commdebug import CommDebugMode

HIDDEN = 16
TOKENS = 64  # per rank and step
TOP_K = 2
EXPERTS_PER_RANK = 2


def tokens_of(rank: int, step: int) -> torch.Tensor:
    """A rank's batch at a step: the same on every process that asks (the fake backend's ranks
    compute their peers' batches from it)."""
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1000 * step + rank))


class MoE(torch.nn.Module):
    def __init__(self, world: int, rank: int, skew: float) -> None:
        super().__init__()
        self.world, self.rank, self.experts_total = world, rank, world * EXPERTS_PER_RANK
        gen = torch.Generator().manual_seed(0)  # one router on every rank
        self.router = torch.nn.Linear(HIDDEN, self.experts_total, bias=False)
        with torch.no_grad():
            self.router.weight.copy_(torch.randn(self.experts_total, HIDDEN, generator=gen) * 0.1)
        # a skewed router: the first rank's experts score higher, more so each step (a router
        # collapsing onto a few experts)
        self.skew = torch.tensor([skew if e < EXPERTS_PER_RANK else 0.0 for e in range(self.experts_total)])
        self.experts = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS_PER_RANK))
        self.bug_at_step: int | None = None
        self.step = 0

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) of each token's top-k, both [tokens, k]."""
        scores = (self.router(x) + self.skew * (1 + self.step)).softmax(-1)  # skewed: worse each step
        return scores.topk(TOP_K, dim=-1)

    def counts(self, chosen: torch.Tensor) -> torch.Tensor:
        return torch.bincount(chosen.flatten(), minlength=self.experts_total)

    def forward(self, x: torch.Tensor, fake: bool) -> torch.Tensor:
        weights, chosen = self.route(x)
        order = chosen.flatten().argsort(stable=True)  # token copies sorted by expert, so by rank
        per_expert = self.counts(chosen)
        send = per_expert.view(self.world, EXPERTS_PER_RANK).sum(1).tolist()
        # how many tokens each of my experts gets from each rank: exchanged first, as real
        # implementations do (the token splits come from it)
        got = fc.wait_tensor(fc.all_to_all_single(per_expert, None, None, dist.group.WORLD))
        if fake:  # nothing arrives on the fake backend: the peers' counts from their seeds
            got = torch.cat([self.counts(self.route(tokens_of(src, self.step))[1]).view(self.world, EXPERTS_PER_RANK)[self.rank]
                             for src in range(self.world)])
        from_rank = got.view(self.world, EXPERTS_PER_RANK)
        recv = from_rank.sum(1).tolist()
        if self.bug_at_step == self.step:
            recv = list(send)  # the bug: skipped the exchange, assumed peers send what I send
        copies = x.repeat_interleave(TOP_K, dim=0)[order]
        arrived = fc.all_to_all_single_autograd(copies, recv, send, dist.group.WORLD)  # dispatch
        arrived = fc.wait_tensor(arrived)
        # run my experts on their tokens (grouped by source rank, then by expert)
        outs, at = [], 0
        for src in range(self.world):
            for e in range(EXPERTS_PER_RANK):
                n = int(from_rank[src, e]) if not self.bug_at_step == self.step else 0
                outs.append(self.experts[e](arrived[at:at + n]))
                at += n
        outs.append(arrived[at:])  # the bug's extra rows (none without it)
        done = fc.wait_tensor(fc.all_to_all_single_autograd(torch.cat(outs), send, recv, dist.group.WORLD))  # combine
        back = torch.empty_like(done)
        back[order] = done
        return (back.view(-1, TOP_K, HIDDEN) * weights.unsqueeze(-1)).sum(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--router", choices=["balanced", "skewed"], default="balanced")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fake", nargs=2, type=int, metavar=("RANK", "WORLD"))
    parser.add_argument("--bug", action="store_true")
    args = parser.parse_args()
    if args.fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        rank, world = args.fake
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = torch.nn.Module()
    model.moe = MoE(world, rank, skew=0.0 if args.router == "balanced" else 0.12)
    if args.bug and rank == 0:
        model.moe.bug_at_step = 1
    routed = []
    with CommDebugMode() as comm:
        for step in range(args.steps):
            model.moe.step = step
            x = tokens_of(rank, step).requires_grad_()  # as if a layer before it made it
            model.moe(x, fake=bool(args.fake)).square().mean().backward()
            with torch.no_grad():  # what my experts got this step, from every rank's routing
                routed.append(sum(int(model.moe.counts(model.moe.route(tokens_of(src, step))[1]).view(world, EXPERTS_PER_RANK)[rank].sum())
                                  for src in range(world)))
            comm.step()
    comm.generate_json_dump(os.path.join(args.out, f"rank{rank}.json"))
    # one write of both lines: the ranks share torchrun's stdout, and a line must not be split
    sys.stdout.write("routed " + json.dumps({"rank": rank, "tokens_received": routed, "tokens_sent": TOKENS * TOP_K,
                                             "token_bytes": HIDDEN * 4}) + f"\nmoe done rank {rank}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown. Once functional collectives have run, torch 2.13
    # keeps a gloo group alive past destroy_process_group, and a gloo worker thread that frees a
    # finished call while the interpreter is torn down aborts the process ("terminate called
    # without an active exception" after "moe done": docs/ranks.md). All this rank writes is written.
    os._exit(0)


if __name__ == "__main__":
    main()
