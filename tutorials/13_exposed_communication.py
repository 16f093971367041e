"""Tutorial 13: exposed communication, the time a rank waits for its collectives, per module.

Run it:  python tutorials/13_exposed_communication.py
It runs programs/13_overlap.py on two gloo ranks under torchrun and `commdebug run
--profile-steps 1-2` three times: each layer's all_reduce blocking, then the same all_reduce
issued asynchronously under an independent branch of compute, then an FSDP2 model; and prints
what `commdebug overlap` says of each, by module, by op, by step and by FSDP unit, the exposed
time split into waiting for the other rank and transfer. Times differ from run to
run (two ranks share this machine's cores): the page shows one run's tables as they were, and
checks only the facts that do not change, which the script prints last.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tutorials" / "programs" / "13_overlap.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(*args, cwd):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=240)
    if proc.returncode != 0:
        sys.exit(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def overlap(*args, cwd):
    print(f"$ commdebug overlap {' '.join(args)}")
    text = run("-m", "commdebug", "overlap", *args, cwd=cwd).stdout
    print(text, end="")
    return json.loads(run("-m", "commdebug", "overlap", *args, "--json", cwd=cwd).stdout)


with tempfile.TemporaryDirectory() as tmp:
    results = {}
    for mode in ("blocking", "async", "fsdp2"):
        print(f"===== {mode}: 2 gloo ranks, steps 1-2 profiled =====")
        print(f"$ torchrun --standalone --nproc-per-node=2 -m commdebug run --out {mode} --profile-steps 1-2 -- "
              f"programs/13_overlap.py --mode {mode} --steps 3")
        job = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "commdebug", "run", "--out", mode,
                  "--profile-steps", "1-2", "--", str(PROGRAM), "--mode", mode, "--steps", "3", cwd=tmp)
        print(job.stdout, end="")
        print("written:", " ".join(sorted(p.name for p in Path(tmp, mode).glob("rank*.json*"))))
        results[mode] = overlap(mode, "--by", "module", cwd=tmp)

    print("===== FSDP2: which collectives are exposed =====")
    overlap("fsdp2", "--by", "op", cwd=tmp)
    overlap("fsdp2", "--by", "step", cwd=tmp)
    units = overlap("fsdp2", "--by", "unit", cwd=tmp)
    print("===== what does not change from run to run =====")
    for mode, result in results.items():
        ranks = result["ranks"]
        modules = sorted({r["module"] for r in result["rows"]})
        added = all(abs(sum(r["exposed_s"] for r in result["rows"] if r["rank"] == k["rank"]) - k["exposed_s"]) < 1e-9 for k in ranks)
        print(f"{mode}: modules {', '.join(modules)}; each rank's module rows add up to its exposed time: {added}")
    for mode, result in [*results.items(), ("fsdp2 --by unit", units)]:
        parts = all(k["exposed_wait_s"] is not None and abs(k["exposed_wait_s"] + k["exposed_transfer_s"] - k["exposed_s"]) < 1e-12
                    for k in result["ranks"] + result["rows"])
        print(f"{mode}: every rank's and row's exposed time is its waiting plus its transfer: {parts}")

    def calls(result: dict, key: str) -> str:
        mine = sorted((r[key], r["calls"]) for r in result["rows"] if r["rank"] == 0)
        return ", ".join(f"{name} {n}" for name, n in mine)

    print(f"fsdp2, rank 0's calls in step 1 per FSDP unit (--by unit): {calls(units, 'unit')}")
    print(f"fsdp2, the same calls per module that issued them (--by module): {calls(results['fsdp2'], 'module')}")
    blocking = max(r["overlap_ratio"] for r in results["blocking"]["ranks"])
    overlapped = max(r["overlap_ratio"] for r in results["async"]["ranks"])
    print(f"blocking all_reduce: under 5% of its time overlapped on every rank: {blocking < 0.05}")
    print(f"async all_reduce: more of its time overlapped than the blocking one's on some rank: {overlapped > blocking}")
