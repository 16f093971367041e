"""Tutorial 6: activation checkpointing in a tensor-parallel transformer: which collectives the
recompute issues again, and how many, with and without checkpointing.

Run it:  python tutorials/06_activation_checkpointing.py
The page 06_activation_checkpointing.md walks through this output.
"""

from collections import Counter
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from commdebug import CommDebugMode
from commdebug.demo import init_fake_world
from commdebug.units import format_bytes

VOCAB, DIM, HEADS, LAYERS = 128, 64, 8, 4
BATCH, SEQ, TP = 4, 16, 8


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape  # -1 below: each rank holds HEADS / TP heads
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.attn = nn.LayerNorm(DIM), Attention()
        self.mlp_norm, self.mlp = nn.LayerNorm(DIM), MLP()

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Model(nn.Module):
    def __init__(self, checkpointed=()):
        super().__init__()
        self.checkpointed = set(checkpointed)  # indices of the blocks to checkpoint
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            if i in self.checkpointed:  # keep only the block's input; recompute the rest in backward
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))


def tp_plan():
    plan = {"embed": RowwiseParallel(input_layouts=Replicate()), "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(LAYERS):
        plan |= {
            f"blocks.{i}.attn.wq": ColwiseParallel(),
            f"blocks.{i}.attn.wk": ColwiseParallel(),
            f"blocks.{i}.attn.wv": ColwiseParallel(),
            f"blocks.{i}.attn.wo": RowwiseParallel(),
            f"blocks.{i}.mlp.up": ColwiseParallel(),
            f"blocks.{i}.mlp.down": RowwiseParallel(),
        }
    return plan


def one_step(checkpointed=(), early_stop=True):
    torch.manual_seed(0)
    model = parallelize_module(Model(checkpointed), mesh, tp_plan())
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    comm = CommDebugMode()
    with comm, set_checkpoint_early_stop(early_stop):
        model(tokens).sum().backward()
    return comm


# Eight simulated ranks in this one process (torch's fake backend): counts and bytes are exact.
init_fake_world(world_size=TP)
mesh = init_device_mesh("cpu", (TP,))

runs = {
    "(a) none": one_step(),
    "(b) blocks 0, 2": one_step(checkpointed={0, 2}),
    "(c) early_stop off": one_step(checkpointed={0, 2}, early_stop=False),
    "(d) all blocks": one_step(checkpointed={0, 1, 2, 3}),
}
ckpt = runs["(b) blocks 0, 2"]

print("===== (b) blocks 0 and 2 checkpointed: table, noise_level=0 =====")
print(ckpt.generate_comm_debug_tracing_table(noise_level=0, color=False), end="")

print("===== (b) the backward pass, call by call =====")
for e in ckpt.trace.events:
    if e.phase != "forward":
        print(f"{e.index:>2}  {e.phase:<10} {e.module:<22} {e.op:<10} {format_bytes(e.size_bytes):>9}  {Path(e.source).name}")

print("===== calls per phase and block: (a) no checkpointing, (b) blocks 0 and 2, (c) the same without early stop, (d) every block =====")
print(f"{'':<19}" + "".join(f" {name:>18}" for name in runs))
rows = {}
for name, comm in runs.items():
    for e in comm.trace.events:
        layer = ".".join(e.module.split(".")[1:3]) if ".blocks." in e.module else e.module.split(".")[-1]
        for key in ((e.phase, layer), (e.phase, "all")):
            rows.setdefault(key, Counter())[name] += 1
order = {"forward": 0, "backward": 1, "checkpoint": 2}
for phase, layer in sorted(rows, key=lambda k: (order[k[0]], k[1] == "all", k[1])):
    counts = rows[(phase, layer)]
    print(f"{phase:<10} {layer:<8}" + "".join(f" {counts[name]:>18}" for name in runs))
print(f"{'total calls':<19}" + "".join(f" {comm.get_total_counts():>18}" for comm in runs.values()))
print(f"{'total bytes':<19}" + "".join(f" {format_bytes(comm.trace.totals()['bytes']):>18}" for comm in runs.values()))
print(f"{'drop-in backward':<19}" + "".join(f" {sum(comm.comm_module_counts['Global']['backward'].values()):>18}" for comm in runs.values()))
