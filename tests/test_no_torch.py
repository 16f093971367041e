"""Offline verbs never import torch: `commdebug check`, `report`, `summary`, `table`, `view`,
`trace`, `diff`, `watch`, `estimate`, `calibrate`, `--help` and `--version` start in a fraction
of a second (importing torch costs seconds and ~250 MB), and so do the worker processes that
read a folder's ranks in parallel.

Each verb runs in a fresh interpreter on real dumps (recorded here on the fake backend, ranks
derived by renumbering, and torch's own Flight Recorder dumps from tests/data), which asserts at
exit that no ``torch`` module was loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_estimate import nccl_tests_output

import commdebug

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

DATA = Path(__file__).parent / "data"

# runs `commdebug ARGS` in this interpreter, then fails if any torch module was imported
NO_TORCH = """
import sys
import commdebug.cli as cli
try:
    rc = cli.main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
if loaded:
    print("TORCH LOADED:", ", ".join(loaded[:5]), file=sys.stderr)
    sys.exit(99)
sys.exit(rc)
"""


def no_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # this checkout's commdebug, not an installed one: the subprocess runs from a temporary folder
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, cwd=cwd, timeout=120, env=env)


@pytest.fixture(scope="module")
def dumps(world, tmp_path_factory) -> dict[str, Path]:
    """A real dump of a tensor-parallel transformer (2 steps on the fake backend), a folder of
    ranks derived from it (one per rank of the world), torch's Flight Recorder dumps, and an nccl-tests output."""
    from commdebug import CommDebugMode
    from commdebug.demo import ModelConfig, tensor_parallel_transformer

    tmp = tmp_path_factory.mktemp("no_torch")
    model = tensor_parallel_transformer(ModelConfig(n_layers=2), world)
    tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    with CommDebugMode() as comm:
        for _ in range(2):
            model(tokens).sum().backward()
    one = tmp / "one.json"
    comm.generate_json_dump(one)
    folder = tmp / "ranks"
    folder.mkdir()
    dump = json.loads(one.read_text())
    for rank in range(world):
        dump["commdebug"]["metadata"]["rank"] = rank
        (folder / f"rank{rank}.json").write_text(json.dumps(dump))
    nccl = tmp / "all_reduce_perf.txt"
    nccl.write_text(nccl_tests_output("all_reduce_perf", 8, 8, 9.0, 250.0, 2 * 7 / 8))
    return {"tmp": tmp, "one": one, "folder": folder, "fr": DATA / "fr_gloo" / "json", "nccl": nccl}


OFFLINE = [
    # (verb line with {placeholders}, expected exit status, a text its stdout holds)
    ("check {folder}", 0, "consistent"),
    ("check {fr}", None, "rank"),
    ("check {folder} -j 2", 0, "consistent"),
    ("report {folder}", 0, "rank"),
    ("report {fr} --json", 0, "ranks"),
    ("summary {folder}", 0, "all_reduce"),
    ("summary {one} --by module", 0, "layers"),
    ("table {one} --noise-level 1", 0, "FORWARD PASS"),
    ("view {folder} -o {tmp}/folder.html", 0, "folder.html"),
    ("view {one} -o {tmp}/one.html", 0, "one.html"),
    ("trace {folder} -o {tmp}/trace.json.gz", 0, "trace.json.gz"),
    ("trace {fr} -o {tmp}/fr.json", 0, "fr.json"),
    ("diff {one} {one}", 0, ""),
    ("watch {folder} --once", None, "rank"),
    ("estimate {one} --cluster h100-ib400", 0, "predicted"),
    ("estimate --list", 0, "h100-ib400"),
    ("calibrate {nccl} -o {tmp}/cluster.json --base h100-ib400", 0, "intra_node"),
    ("--version", 0, "commdebug"),
    ("--help", 0, "VERB"),
]


@pytest.mark.parametrize("line, status, shows", OFFLINE, ids=[line.split()[0] + str(i) for i, (line, _, _) in enumerate(OFFLINE)])
def test_offline_verb_runs_without_torch(dumps, line, status, shows):
    args = [a.format(**dumps) for a in line.split()]
    proc = no_torch(*args, cwd=dumps["tmp"])
    assert proc.returncode != 99, f"commdebug {line} imported torch: {proc.stderr}"
    if status is None:
        assert proc.returncode in (0, 1), proc.stderr
    else:
        assert proc.returncode == status, proc.stderr
    assert shows in proc.stdout


VERBS = ["demo", "view", "table", "summary", "estimate", "calibrate", "run", "hook", "report", "check", "diff",
         "trace", "watch"]


@pytest.mark.parametrize("verb", VERBS)
def test_every_verbs_help_without_torch(verb, tmp_path):
    proc = no_torch(verb, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: commdebug {verb}" in proc.stdout


def test_recording_still_imports_torch_and_every_public_name_resolves(tmp_path):
    """`import commdebug` is torch-free; the recorder and every public name still load on use."""
    code = ("import sys, commdebug\n"
            "assert 'torch' not in sys.modules\n"
            "names = {n: getattr(commdebug, n) for n in commdebug.__all__}\n"
            "from commdebug import CommDebugMode\n"
            "assert 'torch' in sys.modules and CommDebugMode is names['CommDebugMode']\n"
            "print(sorted(names))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "'CommDebugMode'" in proc.stdout and "'load'" in proc.stdout and "'summarize'" in proc.stdout
    assert set(commdebug.__all__) == set(commdebug._LAZY) | {"__version__"}  # every public name loads lazily
    assert set(commdebug.__all__) <= set(dir(commdebug))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        commdebug.nothing  # noqa: B018
