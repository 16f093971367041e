"""A tensor-parallel transformer on a simulated world: the demo, the benchmark's and the tests' workload.

Everything runs in one CPU process with torch's "fake" process-group backend, so any world size
can be simulated; collective counts and bytes are exact, their data and timings are not.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from commdebug.units import format_bytes

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

__all__ = [
    "ModelConfig",
    "Transformer",
    "init_fake_world",
    "tensor_parallel_transformer",
    "fsdp_transformer",
    "fsdp_tp_transformer",
    "run_demo",
]


@dataclass
class ModelConfig:
    vocab_size: int = 256
    dim: int = 64
    n_heads: int = 8
    n_layers: int = 2
    max_seq_len: int = 16
    checkpoint_layers: bool = False
    # None: no dropout modules at all; 0.0: Dropout modules that return their input unchanged
    dropout: float | None = None


def _dropout(cfg: ModelConfig) -> nn.Module | None:
    return None if cfg.dropout is None else nn.Dropout(cfg.dropout)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.resid_dropout = _dropout(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1: under tensor parallelism each rank holds n_heads / tp heads
        q, k, v = (w(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        out = F.softmax(scores, dim=-1) @ v
        out = self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))
        return out if self.resid_dropout is None else self.resid_dropout(out)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.w2 = nn.Linear(4 * cfg.dim, cfg.dim)
        self.resid_dropout = _dropout(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.w2(F.gelu(self.w1(x)))
        return out if self.resid_dropout is None else self.resid_dropout(out)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.dim)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_embeddings = nn.Embedding(cfg.max_seq_len, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(pos)
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.cfg.checkpoint_layers else layer(h)
        return self.output(self.norm(h))


def init_fake_world(world_size: int, rank: int = 0) -> None:
    """Simulate a ``world_size``-rank job in this process (torch's fake backend), once."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(f"a {dist.get_world_size()}-rank world is already initialized in this process")
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def tensor_parallel_transformer(cfg: ModelConfig, world_size: int, device: str = "cpu", *, sequence_parallel: bool = False,
                                mesh: DeviceMesh | None = None) -> Transformer:
    """The transformer with Megatron-style tensor parallelism over all ranks of the world (or
    over ``mesh``, a 1-D DeviceMesh); ``sequence_parallel`` also shards norms and activations
    along the sequence, Megatron-SP style (all_gather / reduce_scatter instead of all_reduce)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = mesh.size() if mesh is not None else world_size
    if cfg.n_heads % tp or cfg.dim % tp:
        raise ValueError(f"n_heads ({cfg.n_heads}) and dim ({cfg.dim}) must be divisible by the tensor-parallel size ({tp})")
    if sequence_parallel and cfg.max_seq_len % tp:
        raise ValueError(f"max_seq_len ({cfg.max_seq_len}) must be divisible by the tensor-parallel size ({tp})")
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    mesh = mesh if mesh is not None else init_device_mesh(device, (world_size,))
    if sequence_parallel:
        plan = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        }
    else:
        plan = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        }
    for i in range(cfg.n_layers):
        layer = f"layers.{i}."
        for name in ("attention.wq", "attention.wk", "attention.wv"):
            plan[layer + name] = ColwiseParallel()
        if sequence_parallel:
            plan[layer + "attention_norm"] = SequenceParallel()
            plan[layer + "ffn_norm"] = SequenceParallel()
            plan[layer + "attention"] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())
            plan[layer + "feed_forward.w1"] = ColwiseParallel(input_layouts=Shard(1))
            plan[layer + "attention.wo"] = RowwiseParallel(output_layouts=Shard(1))
            plan[layer + "feed_forward.w2"] = RowwiseParallel(output_layouts=Shard(1))
        else:
            plan[layer + "feed_forward.w1"] = ColwiseParallel()
            for name in ("attention.wo", "feed_forward.w2"):
                plan[layer + name] = RowwiseParallel()
    parallelize_module(model, mesh, plan)  # in place: the same module, its parameters DTensors
    return model


def fsdp_transformer(cfg: ModelConfig, device: str = "cpu", *, mesh: DeviceMesh | None = None,
                     mp_policy: MixedPrecisionPolicy | None = None) -> Transformer:
    """The transformer with FSDP2 (``fully_shard``) on every block and on the root, over the
    whole world or ``mesh``; ``mp_policy`` is FSDP2's MixedPrecisionPolicy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    policy = mp_policy or MixedPrecisionPolicy()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # in place: the same module, now also an FSDPModule
    return model


def fsdp_tp_transformer(cfg: ModelConfig, dp: int, tp: int, device: str = "cpu", *, sequence_parallel: bool = False) -> Transformer:
    """2-D parallelism: tensor parallel inside each ``tp`` group, FSDP2 across the ``dp`` groups,
    on a ``("dp", "tp")`` DeviceMesh of the whole world (``dp * tp`` ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = tensor_parallel_transformer(cfg, tp, device, sequence_parallel=sequence_parallel, mesh=mesh["tp"])
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])  # in place, as in fsdp_transformer
    return model


def run_demo(world_size: int = 8, layers: int = 4, steps: int = 2, out_dir: str | os.PathLike = "commdebug_demo", noise_level: int = 0, checkpoint_layers: bool = False) -> dict[str, Path]:
    """Train the tensor-parallel transformer for ``steps`` steps under CommDebugMode on a
    simulated ``world_size``-rank world; print the table and write the JSON dump and HTML viewer.

    Returns the paths written: ``{"json": ..., "html": ..., "log": ...}``.
    """
    import visualizer
    from commdebug.debug_mode import CommDebugMode
    from commdebug.errors import CommDebugError
    from commdebug.fileio import output_folder, write_output

    if world_size < 1 or layers < 1 or steps < 1:
        raise CommDebugError("--world-size, --layers and --steps must be at least 1")
    out = output_folder(out_dir)  # before minutes of work, not after
    cfg = ModelConfig(n_layers=layers, n_heads=max(8, world_size), dim=max(64, 8 * world_size), checkpoint_layers=checkpoint_layers)
    try:
        init_fake_world(world_size)
        model = tensor_parallel_transformer(cfg, world_size)
    except (RuntimeError, ValueError) as e:
        raise CommDebugError(str(e)) from None
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len), generator=torch.Generator().manual_seed(0))

    comm = CommDebugMode()
    with comm:
        for step in range(steps):
            model(tokens).sum().backward()
            optimizer.step()  # marks the step boundary
            optimizer.zero_grad()
            print(f"step {step + 1}/{steps}: {comm.get_total_counts()} collectives so far", file=sys.stderr)

    print(comm.generate_comm_debug_tracing_table(noise_level=noise_level))
    paths = {"json": out / "comm_mode_log.json", "log": out / "comm_mode_log.txt", "html": out / "comm_mode_log.html"}
    comm.generate_json_dump(paths["json"], noise_level=3)
    comm.log_comm_debug_tracing_table_to_file(paths["log"], noise_level=3)
    write_output(paths["html"], visualizer.render_html(comm.trace, title="commdebug demo"))
    summary = comm.trace.totals()
    steps_text = f"{comm.trace.steps} step" + ("s" if comm.trace.steps != 1 else "")
    print(f"{summary['collectives']} collectives, {format_bytes(summary['bytes'])} over {steps_text} on {world_size} simulated ranks")
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return paths
