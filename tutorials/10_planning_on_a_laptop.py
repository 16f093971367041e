"""Tutorial 10: planning on a laptop. One model, three parallel plans (FSDP, TP, FSDP + TP) on a
simulated 1,024-rank world, with the communication time each would take per step on a target
cluster, predicted side by side.

Run it:  python tutorials/10_planning_on_a_laptop.py
The page 10_planning_on_a_laptop.md walks through this output.
"""

import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from commdebug import CommDebugMode
from commdebug.analysis.summary import summarize
from commdebug.demo import init_fake_world
from commdebug.units import format_bytes, format_duration

WORLD = 1024  # 128 nodes of 8 GPUs
VOCAB, DIM, HIDDEN, LAYERS = 32768, 4096, 16384, 8
BATCH, SEQ = 1024, 2048  # the global batch: 1,024 sequences of 2,048 tokens per step
CLUSTERS = ("h100-ib400", "a100-ib200")
init_fake_world(WORLD)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return x


def tp_plan(model, mesh):
    """Megatron-style: the embedding split by vocabulary, w1 by columns, w2 by rows."""
    parallelize_module(model, mesh, {"embed": RowwiseParallel(input_layouts=Replicate())})
    for block in model.layers:
        parallelize_module(block, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})


# Meshes hold real rank tables, so they are made before the fake tensors come in.
MESH_1D = init_device_mesh("cpu", (WORLD,))
MESH_2D = init_device_mesh("cpu", (WORLD // 8, 8), mesh_dim_names=("dp", "tp"))


def fsdp(model):
    """All 1,024 ranks shard every block; each rank trains on its own 1 of the 1,024 sequences."""
    mesh = MESH_1D
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return BATCH // WORLD


def tp(model):
    """One tensor-parallel group of all 1,024 ranks; every rank sees the whole batch."""
    tp_plan(model, MESH_1D)
    return BATCH


def fsdp_tp(model):
    """TP inside each node of 8, FSDP across the 128 nodes; each node trains on 8 sequences."""
    mesh = MESH_2D
    tp_plan(model, mesh["tp"])
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return BATCH // (WORLD // 8)


def record(plan):
    """One training step of the plan as rank 0 of the simulated world would issue it."""
    # Fake tensors have shapes and dtypes but no storage: a 1.2-billion-parameter model and
    # 32 GiB activations cost nothing, and every collective is still issued with its real size.
    fake = FakeTensorMode()
    with fake:
        torch.manual_seed(0)
        model = Model()
    # The plan is applied outside the fake mode: the meshes' rank tables stay real tensors.
    sequences = plan(model)
    with fake:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, VOCAB, (sequences, SEQ))
        # cluster=: the dump and the summaries carry predictions on that cluster
        comm = CommDebugMode(cluster=CLUSTERS[0])
        with comm:
            model(tokens).float().pow(2).mean().backward()
            optimizer.step()
    return comm


with FakeTensorMode():
    params = sum(p.numel() for p in Model().parameters())
print(f"model: {params / 1e9:.2f} B parameters; global batch {BATCH} x {SEQ} tokens; {WORLD} ranks, 8 per node")

plans = {"FSDP": fsdp, "TP": tp, "FSDP+TP": fsdp_tp}
recorded = {name: record(plan) for name, plan in plans.items()}

# The same recorded calls, predicted on each cluster (estimation happens here, offline, never
# while recording).
print()
print("===== per step, as rank 0 sees it =====")
head = ["plan", "calls", "bytes"] + [f"predicted {c}" for c in CLUSTERS]
rows = [head]
for name, comm in recorded.items():
    by_step = [summarize(comm.trace, "step", cluster) for cluster in CLUSTERS]
    total = by_step[0].header
    rows.append([name, str(total["collectives"]), format_bytes(total["bytes"])]
                + [format_duration(s.header["predicted_s"]) for s in by_step])
widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
for r in rows:
    print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))

print()
print("===== FSDP+TP: where the time goes (commdebug summary --by group) =====")
comm = recorded["FSDP+TP"]
comm.trace.metadata.update(hostname="laptop", elapsed_s=None)  # this laptop's wall time means nothing here
print(comm.generate_summary_table(by="group"), end="")

# The table shows the prediction on every collective line from noise level 1 on.
print()
print("===== FSDP+TP: the table at noise level 1, first lines =====")
print("\n".join(comm.generate_comm_debug_tracing_table(noise_level=1, color=False).splitlines()[:8]))

# The CLI does the same from a dump: write one and ask for another cluster.
with tempfile.TemporaryDirectory() as tmp:
    comm.generate_json_dump(os.path.join(tmp, "fsdp_tp.json"))
    print()
    print("===== commdebug estimate fsdp_tp.json --cluster a100-ib200 --by phase =====")
    out = subprocess.run([sys.executable, "-m", "commdebug", "estimate", "fsdp_tp.json", "--cluster", "a100-ib200", "--by", "phase"],
                         cwd=tmp, capture_output=True, text=True, check=True).stdout
    print(out, end="")
