"""The viewer benches run end to end on small inputs and print their verdict line (the figures
themselves are read by people: timings on shared machines are too noisy to assert)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
VERDICT = r"median \d+ ms, worst \d+ ms; target 1000 ms; worst/target = \d+\.\d\d \((within|OVER) target\)"


@pytest.mark.parametrize("bench, args, what", [
    ("viewer_scale.py", ["--layers", "2", "--steps", "1"], "first draw"),
    ("viewer_ranks.py", ["--ranks", "4", "--layers", "2", "--mismatch"], "first paint of the tree"),
])
def test_viewer_bench_prints_its_verdict(bench, args, what):
    # this checkout's commdebug: a script's own folder, not the working directory, starts sys.path
    proc = subprocess.run([sys.executable, f"bench/{bench}", *args, "--runs", "1", "--chromium", CHROMIUM],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"^{what}: {VERDICT}$", proc.stdout, flags=re.M), proc.stdout
    assert re.search(r"^run 0: .* (drawn|painted) at \d+ ms", proc.stdout, flags=re.M), proc.stdout
