"""Tutorial 2: a transformer with tensor + sequence parallelism, layer by layer, and what
plain tensor parallelism does instead (commdebug diff).

Run it:  python tutorials/02_sequence_parallel_transformer.py
The page 02_sequence_parallel_transformer.md walks through this output.
"""

import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from commdebug import CommDebugMode
from commdebug.demo import init_fake_world
from commdebug.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
VOCAB, DIM, HEADS, LAYERS = 128, 64, 8, 2
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


def sequence_parallel_plan():
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(LAYERS):
        plan |= {
            f"blocks.{i}.attn_norm": SequenceParallel(),
            f"blocks.{i}.attn": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
            f"blocks.{i}.attn.wq": ColwiseParallel(),
            f"blocks.{i}.attn.wk": ColwiseParallel(),
            f"blocks.{i}.attn.wv": ColwiseParallel(),
            f"blocks.{i}.attn.wo": RowwiseParallel(output_layouts=Shard(1)),
            f"blocks.{i}.mlp_norm": SequenceParallel(),
            f"blocks.{i}.mlp": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
            f"blocks.{i}.mlp.up": ColwiseParallel(),
            f"blocks.{i}.mlp.down": RowwiseParallel(output_layouts=Shard(1)),
        }
    return plan


def tensor_parallel_plan():
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }
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


def attention_input_plan():
    """Plain tensor parallel, plus one placement: attention takes its input as one replicated DTensor."""
    plan = tensor_parallel_plan()
    for i in range(LAYERS):
        plan[f"blocks.{i}.attn"] = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate())
    return plan


def one_step(plan):
    torch.manual_seed(0)
    model = parallelize_module(Model(), mesh, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    comm = CommDebugMode()
    with comm:
        model(tokens).sum().backward()
        grad = model.blocks[0].attn_norm.weight.grad
        optimizer.step()
    where = f"DTensor, placements {grad.placements}" if hasattr(grad, "placements") else "a plain tensor, the same on every rank"
    print(f"blocks.0.attn_norm.weight.grad before optimizer.step(): {where}")
    return comm


SHORT = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR"}
PHASES = ("forward", "backward", "optimizer")


def per_layer(comm, title):
    """Calls per top-level layer and phase, their bytes S, and S x busbw factor."""
    rows = defaultdict(lambda: {"calls": Counter(), "S": 0, "wire": 0.0})
    for e in comm.trace.events:
        parts = e.module.split(".")[1:]  # "Model.blocks.0.attn.wq" -> blocks.0
        layer = ".".join(parts[:2]) if parts[:1] == ["blocks"] else (parts[0] if parts else e.module)
        for row in (rows[layer], rows["total"]):
            row["calls"][(e.phase, SHORT[e.op])] += 1
            row["S"] += e.size_bytes
            row["wire"] += e.size_bytes * e.busbw_factor
    rows["total"] = rows.pop("total")  # last

    def cell(calls, phase):
        return " + ".join(f"{n} {op}" for (p, op), n in sorted(calls.items()) if p == phase) or "-"

    print(f"===== per layer: {title} =====")
    print(f"{'layer':<9} {'forward':<12} {'backward':<12} {'optimizer':<10} {'S':>10} {'S x factor':>11}")
    for layer, row in rows.items():
        cells = [f"{cell(row['calls'], phase):<{w}}" for phase, w in zip(PHASES, (12, 12, 10), strict=True)]
        print(f"{layer:<9} {' '.join(cells)} {format_bytes(row['S']):>10} {format_bytes(row['wire']):>11}")


# Eight simulated ranks in this one process (torch's fake backend): counts and bytes are exact.
init_fake_world(world_size=TP)
mesh = init_device_mesh("cpu", (TP,))

print("===== tensor + sequence parallel: one step =====")
sp = one_step(sequence_parallel_plan())
print(sp.generate_comm_debug_tracing_table(noise_level=0, color=False), end="")
per_layer(sp, "tensor + sequence parallel")

print("===== plain tensor parallel: one step =====")
tp = one_step(tensor_parallel_plan())
per_layer(tp, "plain tensor parallel")

print("===== plain tensor parallel, attention input prepared once: one step =====")
tp_attn = one_step(attention_input_plan())
per_layer(tp_attn, "plain tensor parallel, attention input prepared once")


def commdebug_diff(tmp, a, b):
    cmd = [sys.executable, "-m", "commdebug", "diff", a, b]  # relative names: no temporary path in the output
    diff = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    print(f"===== commdebug diff {a} {b} =====")
    print(diff.stdout + diff.stderr, end="")
    print(f"(exit status {diff.returncode})")


with tempfile.TemporaryDirectory() as tmp:
    sp.generate_json_dump(str(Path(tmp, "sequence_parallel.json")))
    tp.generate_json_dump(str(Path(tmp, "tensor_parallel.json")))
    tp_attn.generate_json_dump(str(Path(tmp, "attention_input.json")))
    commdebug_diff(tmp, "sequence_parallel.json", "tensor_parallel.json")
    commdebug_diff(tmp, "tensor_parallel.json", "attention_input.json")
