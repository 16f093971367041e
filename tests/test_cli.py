"""The `commdebug` command: real subprocesses, real files, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=300)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> subprocess.CompletedProcess:
    out = tmp_path_factory.mktemp("demo")
    proc = cli("demo", "--layers", "2", "--steps", "2", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    proc.out_dir = out  # type: ignore[attr-defined]
    return proc


@pytest.fixture(scope="module")
def demo_dir(demo) -> Path:
    return demo.out_dir


def test_demo_prints_the_table_and_writes_files(demo, demo_dir):
    stdout = demo.stdout
    assert stdout.startswith("Global\n  FORWARD PASS\n")
    assert "Transformer.layers.1.feed_forward.w2" in stdout
    assert "step 2/2" in demo.stderr
    dump = json.loads((demo_dir / "comm_mode_log.json").read_text())
    meta = dump["commdebug"]["metadata"]
    assert meta["world_size"] == 8 and meta["steps"] == 2 and meta["backend"] == "fake"
    total = dump["commdebug"]["summary"]["collectives"]
    assert f"{total} collectives" in stdout
    assert (demo_dir / "comm_mode_log.txt").read_text().startswith("Global\n")
    assert "<html" in (demo_dir / "comm_mode_log.html").read_text()


def test_view_writes_html_next_to_the_dump(demo_dir, tmp_path):
    dump = tmp_path / "run.json"
    dump.write_text((demo_dir / "comm_mode_log.json").read_text())
    proc = cli("view", str(dump))
    assert proc.returncode == 0, proc.stderr
    html = tmp_path / "run.html"
    assert proc.stdout.strip() == str(html)
    assert html.stat().st_size > 10_000
    custom = tmp_path / "sub" / "page.html"
    assert cli("view", str(dump), "-o", str(custom)).returncode == 0 and custom.exists()


def test_view_refuses_to_overwrite_the_dump(demo_dir, tmp_path):
    dump = tmp_path / "run.json"
    dump.write_text((demo_dir / "comm_mode_log.json").read_text())
    proc = cli("view", str(dump), "-o", str(dump))
    assert proc.returncode == 1 and "would overwrite the dump" in proc.stderr
    assert dump.read_text().startswith("{")


def test_table_of_a_dump(demo_dir):
    proc = cli("table", str(demo_dir / "comm_mode_log.json"), "--noise-level", "1")
    assert proc.returncode == 0
    assert "*module type: class 'torch.nn.modules.linear.Linear'" in proc.stdout


def test_viewer_writes_an_empty_viewer(tmp_path):
    out = tmp_path / "viewer.html"
    proc = cli("viewer", "-o", str(out))
    assert proc.returncode == 0 and out.exists()


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), ("{oops", "not valid JSON"), ('{"a": 1}', "not a CommDebugMode dump"), ('{"fqn": "Global", "children": [], "commdebug": {"schema_version": 99}}', "schema version 99")],
)
def test_view_bad_input_one_line_nonzero_and_keeps_old_html(tmp_path, content, message):
    dump = tmp_path / "bad.json"
    if content is not None:
        dump.write_text(content)
    old = tmp_path / "bad.html"
    old.write_text("earlier page")
    proc = cli("view", str(dump))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commdebug: error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr
    assert old.read_text() == "earlier page"


def test_usage_errors_exit_2():
    assert cli("table", "x.json", "--noise-level", "9").returncode == 2
    assert cli("nonsense").returncode == 2


def test_demo_bad_world_size_is_one_line():
    proc = cli("demo", "--world-size", "3", "--layers", "1", "--steps", "1", "--out-dir", "/tmp/commdebug-never")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("commdebug: error: ")
    assert "Traceback" not in proc.stderr
