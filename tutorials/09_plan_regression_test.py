"""Tutorial 9: a parallel plan as a regression test.

Run it:  python tutorials/09_plan_regression_test.py
It copies programs/test_plan.py and programs/09_plan.py into a temporary folder, records the
baseline, runs the test (it passes), changes one layer's placement in the plan, and runs it
again (it fails and shows what changed); then `commdebug diff` on the two dumps.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tutorials" / "programs"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def pytest(tmp, **env):
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_plan.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env={**ENV, **env}, timeout=120)
    lines = proc.stdout.splitlines()
    shown = [line[2:].rstrip() for line in lines if line.startswith("E  ") and ("difference" in line or "->" in line)]
    shown += [line for line in lines if line.startswith("SKIPPED")]
    summary = re.sub(r" in [\d.]+s$", "", lines[-1].strip("= "))  # no timing
    print("\n".join(shown + [summary, f"(exit status {proc.returncode})"]))


with tempfile.TemporaryDirectory() as tmp:
    for name in ("test_plan.py", "09_plan.py"):
        shutil.copy(PROGRAMS / name, tmp)

    print("===== 1. record the baseline: UPDATE_BASELINE=1 pytest test_plan.py =====")
    pytest(tmp, UPDATE_BASELINE="1")
    print("===== 2. the same plan: pytest test_plan.py =====")
    pytest(tmp)

    plan = Path(tmp, "09_plan.py")
    old = plan.read_text()
    new = old.replace('"blocks.1.up": ColwiseParallel(),', '"blocks.1.up": ColwiseParallel(output_layouts=Replicate()),')
    new = new.replace('"blocks.1.down": RowwiseParallel(),', '"blocks.1.down": RowwiseParallel(input_layouts=Replicate()),')
    new = new.replace("from torch.distributed.tensor.parallel", "from torch.distributed.tensor import Replicate\nfrom torch.distributed.tensor.parallel")
    plan.write_text(new)
    print("===== 3. the plan changed =====")
    before, after = old.splitlines(), new.splitlines()
    print("\n".join(f"- {line}" for line in before if line not in after))
    print("\n".join(f"+ {line}" for line in after if line not in before))
    print("===== 4. pytest test_plan.py =====")
    pytest(tmp)

    print("===== 5. commdebug diff plan_baseline.json plan_this_run.json =====")
    diff = subprocess.run([sys.executable, "-m", "commdebug", "diff", "plan_baseline.json", "plan_this_run.json"],
                          capture_output=True, text=True, cwd=tmp, env=ENV, timeout=60)
    print(diff.stdout, end="")
    print(f"(exit status {diff.returncode})")
