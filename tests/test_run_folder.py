"""`commdebug run`'s folder for its children's start-up hook: removed when the run ends, and,
where a run was killed with SIGKILL (nothing runs then to remove it), by the next run on the
host, never while the run that made it is alive or when another host made it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from commdebug.launch.children import PREFIX, ChildRecording

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
from commdebug.launch.children import ChildRecording
recording = ChildRecording(sys.argv[1], {}).__enter__()
print(recording._folder, flush=True)
time.sleep(120)
"""


def test_a_killed_runs_folder_is_removed_by_the_next_run_and_no_one_elses(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    killed = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True, env=env)
    live = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert killed.stdout is not None and live.stdout is not None
        killed_folder, live_folder = Path(killed.stdout.readline().strip()), Path(live.stdout.readline().strip())
        assert killed_folder.name.startswith(f"{PREFIX}{killed.pid}@{socket.gethostname()}+"), killed_folder
        assert (killed_folder / "sitecustomize.py").exists() and (live_folder / "sitecustomize.py").exists()
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert killed_folder.exists()  # SIGKILL: nothing ran to remove it
        here, _, namespace = killed_folder.name[len(PREFIX):].rpartition("-")[0].partition("@")[2].partition("+")
        # a shared TMPDIR: another host's, or another container's of the same host name: not ours to judge
        elsewhere = tmp_path / f"{PREFIX}{killed.pid}@another-host+{namespace}-abc123"
        other_container = tmp_path / f"{PREFIX}{killed.pid}@{here}+{int(namespace) + 1}-abc123"
        old_style = tmp_path / f"{PREFIX}x1y2z3w4"
        for folder in (elsewhere, other_container, old_style):
            folder.mkdir()

        with ChildRecording(tmp_path / "out", {}) as recording:
            assert recording._folder is not None
            own = Path(recording._folder)
            assert own.name.startswith(f"{PREFIX}{os.getpid()}@") and (own / "sitecustomize.py").exists()
            assert not killed_folder.exists(), "the killed run's folder is left"
            assert live_folder.exists(), "a live run's folder was removed"
            assert elsewhere.exists() and other_container.exists() and old_style.exists()
        assert not own.exists(), "the run's own folder is left after it ended"
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait(timeout=30)
