"""Tutorial 8: finding the rank and line behind a hang, from the dumps of a job that hung.

Run it:  python tutorials/08_finding_a_hang.py
It runs programs/08_hang.py on two gloo ranks under `commdebug run --hang-timeout 2`; the
program's own gloo timeout (8 s) ends the hang. Then `commdebug check` on the dumps.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import commdebug

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tutorials" / "programs" / "08_hang.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def clean(text, tmp):
    """Paths as the page shows them: the program relative to tutorials/, no temp folder."""
    return text.replace(str(PROGRAM.parent.parent) + os.sep, "").replace(tmp + os.sep, "")


with tempfile.TemporaryDirectory() as tmp:
    print("$ torchrun --standalone --nproc-per-node=2 -m commdebug run --out traces --hang-timeout 2 -- programs/08_hang.py")
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          "-m", "commdebug", "run", "--out", "traces", "--hang-timeout", "2", "--", str(PROGRAM)],
                         capture_output=True, text=True, cwd=tmp, env=ENV, timeout=120)
    print(f"exit status {job.returncode}")
    print("--- commdebug's lines on stderr (sorted; the seconds, the pids and how each rank ended vary) ---")
    ours = [re.sub(r"stuck for \d+ s", "stuck for … s", clean(line, tmp)) for line in job.stderr.splitlines() if line.startswith("commdebug: rank")]
    # each rank ends by gloo's timeout error (exit 1) or by torchrun's SIGTERM once the other failed
    ours = [re.sub(r"\(pid \d+\): program ended (\(exit \d+\)|by SIGTERM)", "(pid …): program ended …", line) for line in ours]
    print("\n".join(sorted(ours)))

    print("===== the last events of each rank =====")
    failed = []
    for r in (0, 1):
        trace = commdebug.load(Path(tmp, "traces", f"rank{r}.json"))
        for e in list(trace.events)[-3:]:
            mark = "  <- unfinished" if e.in_flight else ""
            print(f"rank {r}: step {e.step} seq {e.seq} {e.op:<10} {e.size_bytes:>5} B  {clean(e.source, tmp)}{mark}")
            failed += [e.error] if e.error else []
    # Which rank times out first, and whether torchrun stops the other before its own call
    # raises, varies from run to run; the rank that timed out first always has the error.
    print(f"gloo's error is in the dump of the rank that timed out first: {bool(failed)}")

    print("===== commdebug check traces/ =====")
    check = subprocess.run([sys.executable, "-m", "commdebug", "check", "traces"], capture_output=True, text=True, cwd=tmp, env=ENV, timeout=60)
    # a rank ends by gloo's RuntimeError, or by torchrun's SIGTERM when the other rank failed first
    print(re.sub(r"ended by (RuntimeError: [^;]*|SIGTERM);", "ended by …;", clean(check.stdout, tmp)), end="")
    print(f"(exit status {check.returncode})")
