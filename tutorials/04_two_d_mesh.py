"""Tutorial 4: FSDP2 + tensor parallelism on a 2-D DeviceMesh ("dp", "tp"): which collective
runs on which mesh dimension, for a 2 x 4 and a 4 x 2 mesh of the same 8 ranks.

Run it:  python tutorials/04_two_d_mesh.py
The page 04_two_d_mesh.md walks through this output.
"""

import warnings
from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from commdebug import CommDebugMode
from commdebug.demo import init_fake_world
from commdebug.units import format_bytes

VOCAB, DIM, HEADS, LAYERS = 128, 64, 8, 2
GLOBAL_BATCH, SEQ, WORLD = 8, 16, 8


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape  # -1 below: each rank holds HEADS / tp heads
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
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
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


def one_step(dp, tp):
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(Model(), mesh["tp"], tp_plan())  # tensor parallel inside each tp group
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])  # FSDP across the tp groups
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ))
    local = tokens.chunk(dp)[mesh.get_local_rank("dp")]  # this dp rank's share of the batch

    comm = CommDebugMode()
    with comm:
        model(local).sum().backward()
        optimizer.step()

    print(f"===== mesh {dp} x {tp}: layout =====")
    print(f"mesh {mesh.mesh.tolist()}: a row is a tp group, a column a dp group")
    print(f"this process is rank 0: batch {list(local.shape)} of {list(tokens.shape)}")
    for g in sorted(comm.trace.groups.values(), key=lambda g: g.label):
        print(f"{g.label:<11} ranks {list(g.ranks)}")
    return comm


def by_group(comm, title):
    """Calls and bytes per process group, phase and op; S x busbw factor per group."""
    rows = defaultdict(lambda: [0, 0, 0.0])
    for e in comm.trace.events:
        for key in ((e.group.label, e.phase, e.op), (e.group.label, "", "")):
            rows[key][0] += 1
            rows[key][1] += e.size_bytes
            rows[key][2] += e.size_bytes * e.busbw_factor
    print(f"===== {title}: per group, phase and op =====")
    print(f"{'group':<11} {'phase':<9} {'op':<14} {'calls':>5} {'S':>11} {'S x factor':>11}")
    order = {"forward": 0, "backward": 1, "optimizer": 2, "": 3}
    for (group, phase, op), (calls, s, wire) in sorted(rows.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])):
        print(f"{group:<11} {phase or 'all':<9} {op:<14} {calls:>5} {format_bytes(s):>11} {format_bytes(wire):>11}")


# FSDP2 warns that the root returns a view (the head's gathered logits); nothing here changes it in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
init_fake_world(world_size=WORLD)  # 8 simulated ranks in this process; it is rank 0

comm = one_step(dp=2, tp=4)
print("===== mesh 2 x 4: table, noise_level=0 =====")
print(comm.generate_comm_debug_tracing_table(noise_level=0, color=False), end="")
print("===== mesh 2 x 4: generate_summary_table(by=\"group\", header=False) =====")
print(comm.generate_summary_table(by="group", header=False), end="")
by_group(comm, "mesh 2 x 4")

by_group(one_step(dp=4, tp=2), "mesh 4 x 2")
