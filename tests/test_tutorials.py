"""Tutorials are run as a user runs them, and their pages show the output they really print."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9]*.py"))


def test_there_are_tutorials():
    assert TUTORIALS


@pytest.mark.proc
@pytest.mark.parametrize("script", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_runs_and_its_page_shows_real_output(script):
    # this checkout's commdebug: a script's own folder, not the working directory, starts sys.path
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    page = script.with_suffix(".md").read_text()
    blocks = re.findall(r"```text\n(.*?)```", page, flags=re.S)
    assert blocks, f"{script.with_suffix('.md').name} shows no output"
    for block in blocks:
        assert block in proc.stdout, f"this block of the page is not what the script prints:\n{block}"
