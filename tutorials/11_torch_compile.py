"""Tutorial 11: a TP + FSDP2 model compiled per block, as torchtitan compiles its transformer blocks.

Records the same two training steps eager and compiled (Inductor, fullgraph=True), shows what the
compiled blocks issue, and diffs the two dumps with `commdebug diff`.

    python tutorials/11_torch_compile.py
"""

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from commdebug import CommDebugMode  # noqa: E402
from commdebug.demo import init_fake_world  # noqa: E402

logging.getLogger("commdebug").setLevel(logging.ERROR)  # the note is in the table's header below
init_fake_world(8)  # one process plays rank 0 of 8 (torch's fake backend)
mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build(compiled: bool) -> Model:
    torch.manual_seed(0)
    model = Model()
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if compiled:
            block.compile(fullgraph=True)  # per block, before FSDP2 wraps it, as torchtitan does
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def steps(model: Model) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def recorded(model: Model, out: Path) -> CommDebugMode:
    with CommDebugMode() as comm:
        steps(model)
    comm.generate_json_dump(str(out))
    return comm


def graphs(run) -> tuple:
    """What Dynamo compiled for `run`, from a clean cache."""
    torch._dynamo.reset()
    counters.clear()
    result = run()
    return f"{counters['stats']['unique_graphs']} graphs, {sum(counters['graph_break'].values())} graph breaks", result


folder = Path(tempfile.mkdtemp(prefix="commdebug-tutorial-11-"))
recorded(build(compiled=False), folder / "eager.json")
bare, _ = graphs(lambda: steps(build(compiled=True)))
under, comm = graphs(lambda: recorded(build(compiled=True), folder / "compiled.json"))
print(f"Dynamo without commdebug: {bare}; under CommDebugMode: {under}")
compiled = [e for e in comm.trace.events if e.compiled]
print(f"{len(compiled)} of {len(comm.trace.events)} collectives came from compiled code: "
      f"{sorted({e.aten_op for e in compiled})}")
print(f"their source lines: {sorted({(e.phase, Path(e.source).name) for e in compiled})}")
table = comm.generate_comm_debug_tracing_table(noise_level=1)
print(table.splitlines()[0])  # the header says what compiled code gets
start = table.index("        FSDPModel.layers.0\n")
print(table[start: table.index("        FSDPModel.layers.1\n")], end="")

env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
diff = subprocess.run([sys.executable, "-m", "commdebug", "diff", "eager.json", "compiled.json"],
                      cwd=folder, capture_output=True, text=True, env=env)
print(f"$ commdebug diff eager.json compiled.json   (exit {diff.returncode})")
print(diff.stdout, end="")
for dump in folder.iterdir():  # the two dumps were only for the diff
    dump.unlink()
folder.rmdir()
