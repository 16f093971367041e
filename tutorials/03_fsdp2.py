"""Tutorial 3: FSDP2 (fully_shard) over two training steps, then with bf16 mixed precision.

Run it:  python tutorials/03_fsdp2.py
The page 03_fsdp2.md walks through this output.
"""

from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from commdebug import CommDebugMode
from commdebug.demo import init_fake_world
from commdebug.units import format_bytes

DIM, WORLD, STEPS = 256, 8, 2


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, hidden)
        self.down = nn.Linear(hidden, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(64, DIM)
        # three widths, so that the size of an all_gather tells whose parameters it carries
        self.blocks = nn.ModuleList(Block(hidden) for hidden in (2 * DIM, 3 * DIM, 4 * DIM))
        self.head = nn.Linear(DIM, 64)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train(mp_policy=MixedPrecisionPolicy()):
    torch.manual_seed(0)
    model = Model()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)  # the root: embed and head
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # clip inside optimizer.step(), in a pre-hook: its all_reduce is in the optimizer phase
    optimizer.register_step_pre_hook(lambda *args: clip(model))
    x = torch.randn(16, 64)

    comm = CommDebugMode()
    with comm:
        for step in range(STEPS):
            model(x).sum().backward()
            optimizer.step()  # marks a step boundary
            optimizer.zero_grad()
    return comm


def clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)


def unit_sizes():
    """Parameters (elements) of each FSDP unit: each block, and the root (embed + head)."""
    model = Model()
    sizes = {f"blocks.{i}": sum(p.numel() for p in b.parameters()) for i, b in enumerate(model.blocks)}
    sizes["root"] = sum(p.numel() for p in model.parameters()) - sum(sizes.values())
    return sizes


# Eight simulated ranks in this one process (torch's fake backend): counts and bytes are exact.
init_fake_world(world_size=WORLD)
mesh = init_device_mesh("cpu", (WORLD,))

fp32 = train()
print("===== float32: table, noise_level=0, both steps =====")
print(fp32.generate_comm_debug_tracing_table(noise_level=0, color=False), end="")

print("===== float32: generate_summary_table(by=\"step\", header=False) =====")
print(fp32.generate_summary_table(by="step", header=False), end="")

owner = {n: unit for unit, n in unit_sizes().items()}
print("===== float32: every collective of step 0 =====")
print(f"{'#':>2}  {'phase':<9} {'module':<18} {'op':<14} {'elements':>8}  {'unit':<8} {'by size':<8} {'S':>10}")
for e in fp32.trace.events:
    if e.step == 0:
        n = max(s[0] for s in e.input_shapes + e.output_shapes)  # the whole (unsharded) flat buffer
        unit = "-" if e.unit is None else "root" if e.unit == "FSDPModel" else e.unit.removeprefix("FSDPModel.")
        print(f"{e.index:>2}  {e.phase:<9} {e.module:<18} {e.op:<14} {n:>8}  {unit:<8} {owner.get(n, '-'):<8} {format_bytes(e.size_bytes):>10}")

print("===== parameters per FSDP unit =====")
for unit, n in unit_sizes().items():
    print(f"{unit:<8} {n:>7} elements = {format_bytes(4 * n):>10} in float32, {format_bytes(2 * n):>10} in bfloat16")

runs = {
    "(a) float32": fp32,
    "(b) bf16": train(MixedPrecisionPolicy(param_dtype=torch.bfloat16)),
    "(c) bf16+fp32": train(MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)),
}
print("===== bytes per step: (a) float32, (b) param_dtype=torch.bfloat16, (c) and reduce_dtype=torch.float32 =====")
SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16"}
table = defaultdict(dict)  # (phase, op) -> run -> [bytes per step, dtypes]
for name, comm in runs.items():
    for e in comm.trace.events:
        for key in ((e.phase, e.op), ("total", "")):
            cell = table[key].setdefault(name, [0, set()])
            cell[0] += e.size_bytes // STEPS
            cell[1].add(SHORT[getattr(torch, e.dtype)])
table[("total", "")] = table.pop(("total", ""))  # last
print(f"{'phase':<9} {'op':<14}" + "".join(f" {name:>16}" for name in runs) + f" {'b/a':>6} {'c/a':>6}")
for (phase, op), cells in table.items():
    shown = [f"{format_bytes(b)}" + ("" if phase == "total" else f" {'+'.join(sorted(d))}") for b, d in cells.values()]
    a, b, c = (cells[name][0] for name in runs)
    print(f"{phase:<9} {op:<14}" + "".join(f" {cell:>16}" for cell in shown) + f" {b / a:>6.3f} {c / a:>6.3f}")
