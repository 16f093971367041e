"""Synthetic torch.profiler traces of NCCL jobs, in Kineto's own layout (the C++ writer's, as in
tests/data/kineto/): each collective a ``record_param_comms`` with its args, the
``cudaLaunchKernel`` inside it and its ``ncclDevKernel_*`` on a stream; compute kernels launched
from their own CPU ops; ``ProfilerStep#N`` spans. For tests of many ranks, groups, sequence
numbers and all_to_all splits, which no real trace here has (no GPU is lent to this project).

    calls = [Call("allreduce", "0", cpu=(100, 20), kernel=(130, 50), nelems=1024)]
    write_trace(path, rank=0, world=2, groups={"0": ("default_pg", [0, 1])}, steps=[(1, 0, 1000)], calls=calls)
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

PID, MAIN, STREAM_COMM, STREAM_COMPUTE = 4242, 4242, 20, 7


@dataclass
class Call:
    """One collective: its Kineto "Collective name", group name, CPU span and kernel span (µs)."""

    name: str
    group: str
    cpu: tuple[float, float]  # (start, duration)
    kernel: tuple[float, float] | None
    nelems: int = 1024
    out_nelems: int | None = None
    dtype: str = "Float"
    in_splits: list[int] = field(default_factory=list)
    out_splits: list[int] = field(default_factory=list)
    seq: int | None = None  # torch's "Seq" (from 1); None: not written
    peer: int | None = None  # send/recv: the other side's rank in the group


def _event(ph: str, cat: str, name: str, tid: int, ts: float, dur: float, args: dict, pid: int = PID) -> str:
    head = json.dumps({"ph": ph, "cat": cat, "name": name, "pid": pid, "tid": tid})[1:-1]
    body = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in args.items())
    return f"  {{\n    {head},\n    \"ts\": {ts:.3f}, \"dur\": {dur:.3f},\n    \"args\": {{\n      {body}\n    }}\n  }}"


def _launch(tid: int, ts: float, external: int, correlation: int) -> str:
    """A cudaLaunchKernel exactly as Kineto writes it (tests/data/kineto/)."""
    return (f"  {{\n    \"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": {PID}, \"tid\": {tid},\n"
            f"    \"ts\": {ts:.3f}, \"dur\": 4.000,\n    \"args\": {{\n      \"External id\": {external},      \"cbid\": 211, "
            f"\"correlation\": {correlation}\n    }}\n  }}")


def trace_text(rank: int, world: int, groups: dict[str, tuple[str, list[int]]], steps: list[tuple[int, float, float]],
               calls: list[Call], compute: list[tuple[float, float]] = (), seq: bool = True) -> str:
    """The trace of one rank as Kineto writes it (see the module docstring)."""
    pg_config = [{"pg_name": n, "pg_desc": d, "backend_config": "cuda:nccl", "pg_size": len(r), "ranks": r} for n, (d, r) in groups.items()]
    events: list[str] = []
    external, correlation = 100, 1000
    for number, start, end in steps:
        events.append(_event("X", "user_annotation", f"ProfilerStep#{number}", MAIN, start, end - start, {"External id": external}))
        external += 1
    for c in calls:
        desc, ranks = groups[c.group]
        args = {"External id": external, "Process Group Name": c.group, "Process Group Description": desc,
                "Process Group Ranks": str(ranks), "Group size": len(ranks), "In msg nelems": c.nelems,
                "Out msg nelems": c.out_nelems if c.out_nelems is not None else c.nelems,
                "In split size": str(c.in_splits), "Out split size": str(c.out_splits), "dtype": c.dtype,
                "Collective name": c.name, "Rank": rank}
        if seq and c.seq is not None:
            args["Seq"] = c.seq
        if c.peer is not None:
            args["Dst Rank" if c.name == "send" else "Src Rank"] = c.peer
        events.append(_event("X", "cpu_op", "record_param_comms", MAIN, c.cpu[0], c.cpu[1], args))
        if c.kernel is not None:
            events.append(_launch(MAIN, c.cpu[0] + c.cpu[1] / 2, external, correlation))
            events.append(_event("X", "kernel", f"ncclDevKernel_{c.name}_RING_LL(ncclDevKernelArgsStorage<4096ul>)", STREAM_COMM,
                                 c.kernel[0], c.kernel[1], {"External id": external, "device": 0, "stream": STREAM_COMM,
                                                           "correlation": correlation}, pid=0))
            correlation += 1
        external += 1
    for start, dur in compute:
        launched = max(start - 5.0, 0.0)
        events.append(_event("X", "cpu_op", "aten::mm", MAIN, launched - 1.0, 3.0, {"External id": external}))
        events.append(_launch(MAIN, launched, external, correlation))
        events.append(_event("X", "kernel", "ampere_sgemm_128x64_nn", STREAM_COMPUTE, start, dur,
                             {"External id": external, "device": 0, "stream": STREAM_COMPUTE, "correlation": correlation}, pid=0))
        external += 1
        correlation += 1
    info = json.dumps({"backend": "nccl", "rank": rank, "world_size": world, "pg_count": len(groups), "pg_config": pg_config})
    return ("{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [],\n  \"distributedInfo\": " + info + ",\n  \"traceEvents\": [\n"
            + ",\n".join(events) + "\n],\n  \"traceName\": \"synthetic\",\n  \"displayTimeUnit\": \"ms\"\n}\n")


def document(events: list[str], rank: int, world: int, groups: dict[str, tuple[str, list[int]]], backend: str = "nccl") -> str:
    """A trace of ``events`` (as :func:`event` and :func:`launch` write them) in Kineto's layout,
    with ``distributedInfo`` naming ``groups``."""
    pg_config = [{"pg_name": n, "pg_desc": d, "backend_config": f"cuda:{backend}", "pg_size": len(r), "ranks": r} for n, (d, r) in groups.items()]
    info = json.dumps({"backend": backend, "rank": rank, "world_size": world, "pg_count": len(groups), "pg_config": pg_config})
    return ("{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [],\n  \"distributedInfo\": " + info + ",\n  \"traceEvents\": [\n"
            + ",\n".join(events) + "\n],\n  \"traceName\": \"synthetic\",\n  \"displayTimeUnit\": \"ms\"\n}\n")


event, launch = _event, _launch  # for tests that lay out their own records


def write_trace(path: Path, rank: int, world: int, groups: dict[str, tuple[str, list[int]]], steps: list[tuple[int, float, float]],
                calls: list[Call], compute: list[tuple[float, float]] = (), seq: bool = True) -> Path:
    text = trace_text(rank, world, groups, steps, calls, compute, seq)
    path.write_bytes(gzip.compress(text.encode(), compresslevel=1) if path.name.endswith(".gz") else text.encode())
    return path
