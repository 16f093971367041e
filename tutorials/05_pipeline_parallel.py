"""Tutorial 5: pipeline parallelism (torch.distributed.pipelining) on two real gloo ranks.

Run it:  python tutorials/05_pipeline_parallel.py
It launches programs/05_pipeline.py with torchrun (2 ranks, CPU, gloo), then reads the two
per-rank dumps. The page 05_pipeline_parallel.md walks through this output.
"""

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import commdebug
from commdebug.render.table import render_table

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tutorials" / "programs" / "05_pipeline.py"
BATCH, MICROBATCHES, WIDTH = 8, 4, 32  # as in the program

with tempfile.TemporaryDirectory() as tmp:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(PROGRAM), tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=180)
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    traces = {rank: commdebug.load(Path(tmp, f"rank{rank}.json")) for rank in (0, 1)}

    for rank, trace in traces.items():
        print(f"===== rank {rank}: table, noise_level=0 =====")
        print(render_table(trace, 0), end="")

    for rank, trace in traces.items():
        print(f"===== rank {rank}: point-to-point events of step 0 =====")
        print(f"{'#':>2}  {'op':<4} {'phase':<8} {'module':<6} {'mb':>2} {'peer':>4} {'p2p_seq':>7}  {'dtype':<7} {'shape':<8} {'bytes':>5}")
        for e in trace.events:
            if e.step != 0:
                continue
            shape = (e.input_shapes or e.output_shapes)[0]
            mb = "-" if e.microbatch is None else e.microbatch
            print(f"{e.index:>2}  {e.op:<4} {e.phase:<8} {e.module:<6} {mb:>2} {e.peer:>4} {e.p2p_seq:>7}  {e.dtype:<7} {str(list(shape)):<8} {e.size_bytes:>5}")

    print("===== per rank, both steps =====")
    for rank, trace in traces.items():
        counts = Counter((e.op, e.phase, e.module) for e in trace.events)
        for (op, phase, module), n in sorted(counts.items()):
            print(f"rank {rank}: {op:<4} {phase:<8} {module:<6} x{n}")

    print("===== every send meets its receive =====")
    sends = {(r, e.peer, e.p2p_seq): e for r, t in traces.items() for e in t.events if e.op == "send"}
    recvs = {(e.peer, r, e.p2p_seq): e for r, t in traces.items() for e in t.events if e.op == "recv"}
    same = [k for k in sends if k in recvs and sends[k].size_bytes == recvs[k].size_bytes]
    print(f"{len(sends)} sends, {len(recvs)} receives, {len(same)} pairs with the same (sender, receiver, p2p_seq) and size")
    activation = BATCH // MICROBATCHES * WIDTH * 4  # rows per microbatch x width x float32
    print(f"one microbatch's activation: {BATCH}/{MICROBATCHES} rows x {WIDTH} x 4 B = {activation} B")
    check = subprocess.run([sys.executable, "-m", "commdebug", "check", tmp], capture_output=True, text=True, env=env, timeout=60)
    print(f"$ commdebug check traces/   (exit {check.returncode})")
    print(check.stdout.replace(tmp, "traces").replace(str(PROGRAM.parent.parent) + os.sep, ""), end="")

# torch's own CommDebugMode keeps a fixed list of the collectives it counts; send and recv are not in it.
import torch  # noqa: E402
from torch.distributed.tensor.debug import _comm_mode  # noqa: E402

print("===== torch's CommDebugMode =====")
for op in ("allreduce_", "send", "recv_"):
    print(f"counts c10d.{op}: {getattr(torch.ops.c10d, op) in _comm_mode.c10d_collective_ops}")
