"""The tensor-parallel plan under test: which layer is split how."""

from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

PLAN = {
    "blocks.0.up": ColwiseParallel(),
    "blocks.0.down": RowwiseParallel(),
    "blocks.1.up": ColwiseParallel(),
    "blocks.1.down": RowwiseParallel(),
}
