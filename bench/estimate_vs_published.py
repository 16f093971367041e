"""Predicted busbw of each preset next to the published nccl-tests figures it was built from,
and next to torch's own estimators (DTensor's allreduce_cost & co. and inductor's
estimate_nccl_collective_runtime_impl), as ratios. CPU only; prints a markdown table.

    python bench/estimate_vs_published.py
"""

from __future__ import annotations

from commdebug import ops
from commdebug.estimate import PRESETS, predict_events
from commdebug.estimate.presets import PUBLISHED
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.units import format_bytes

OPS = ("all_reduce", "all_gather", "reduce_scatter")
SIZES = (8 << 10, 1 << 20, 64 << 20, 1 << 30)
LAYOUTS = ((8, "8 GPUs, 1 node"), (16, "16 GPUs, 2 nodes"))


def _event(op: str, size: int, n: int) -> CollectiveEvent:
    group = GroupInfo(f"g{n}", "", n, tuple(range(n)))
    factor = ops.spec_for_op(op).busbw_factor(n)
    return CollectiveEvent(0, op, op, op, 0, "forward", "Global", group, 0, "bfloat16", (), (), size, size, size, factor)


def predicted_busbw(cluster, op: str, size: int, n: int) -> tuple[float, float]:
    e = _event(op, size, n)
    (t,) = predict_events([e], cluster).seconds
    return t, size * e.busbw_factor / t / 1e9


def torch_estimates(op: str, size: int, n: int) -> tuple[float | None, float | None]:
    """(DTensor cost model seconds, inductor NCCL model seconds), None where unavailable."""
    dtensor = inductor = None
    try:
        from torch.distributed.tensor import _collective_utils as cu

        class Topo:  # MeshTopoInfo's figures for a 1-d mesh, without building a DeviceMesh
            mesh_dim_devices = [n]
            mesh_dim_bandwidth = [87.7 * (0.22 if n > 8 else 1.0)]
            mesh_dim_latency = [2.7 if n > 8 else 0.6]

        cost = {"all_reduce": cu.allreduce_cost, "all_gather": cu.allgather_cost, "reduce_scatter": cu.reduce_scatter_cost}[op]
        dtensor = cost(size / 1e9, Topo, 0) * 1e-6
    except Exception:
        pass
    try:
        from torch._inductor import comm_analysis as ca

        coll = {"all_reduce": ca.NCCL_COLL.ALL_REDUCE, "all_gather": ca.NCCL_COLL.ALL_GATHER,
                "reduce_scatter": ca.NCCL_COLL.REDUCE_SCATTER}[op]
        ms = ca.estimate_nccl_collective_runtime_impl(size, n, coll)
        inductor = ms * 1e-3 if ms else None
    except Exception:
        pass
    return dtensor, inductor


def _ratio(other: float | None, ours: float) -> str:
    return "-" if other is None else f"{other / ours:.2f}"


def main() -> None:
    for name, cluster in PRESETS.items():
        print(f"\n### {name}\n")
        print("| op | layout | S | predicted time | predicted busbw GB/s | torch DTensor t / ours | torch inductor t / ours |")
        print("|---|---|---|---|---|---|---|")
        for op in OPS:
            for n, layout in LAYOUTS:
                for size in SIZES:
                    t, bw = predicted_busbw(cluster, op, size, n)
                    dt, ind = torch_estimates(op, size, n)
                    print(f"| {op} | {layout} | {format_bytes(size)} | {t * 1e3:.4f} ms | {bw:.1f} | {_ratio(dt, t)} | {_ratio(ind, t)} |")
        print(f"\npublished figures for {name}:\n")
        print("| op | ranks | nodes | S | published busbw GB/s | predicted busbw GB/s | source |")
        print("|---|---|---|---|---|---|---|")
        for p in PUBLISHED[name]:
            _, bw = predicted_busbw(cluster, p.op, p.size_bytes, p.ranks)
            print(f"| {p.op} | {p.ranks} | {p.nodes} | {format_bytes(p.size_bytes)} | {p.busbw_gbps:.1f} | {bw:.1f} | {p.source} |")


if __name__ == "__main__":
    main()
