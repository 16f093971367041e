"""Shared fixtures and the suite's own rules for running in parallel.

- One simulated 8-rank world (torch's fake backend) per test process.
- Parallel workers (pytest-xdist, `bash scripts/dev.sh test` runs them; docs/development.md):
  tests that share a module-scoped fixture run in one worker, so the fixture's job runs once;
  tests that start processes are handed out first, so the cheap in-process ones fill the gaps at
  the end; each worker finds free ports only in a range of its own (bench/ports.py).
- `shared_run`: a real job that tests of several modules read is made once per run, whichever
  worker asks first, and read by all.
- `--no-processes` (`bash scripts/dev.sh test --fast`): only the tests that start no process
  and no browser, and a test that starts a process anyway fails, saying to mark it `proc`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# One thread per process: the workers and the processes the tests start share two cores, and
# torch's OpenMP threads spin while they wait, so a second thread per process only takes time from
# the others (the overhead bench's smoke run: 54 s of CPU with two threads under the suite's load,
# 12 s with one). Before torch is imported: OpenMP reads it once. The processes inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

WORLD = 8
ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "bench"))  # the benches' helpers (ports.py, ranks_scale.py) import by name

from ports import RANGE_VARIABLE  # noqa: E402

# Each worker's ports: 1,000 of them, below the kernel's ephemeral range (32768 and up), which
# torchrun --standalone and every connection take theirs from.
PORTS_BASE, PORTS_PER_WORKER = 20000, 1000


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-processes", action="store_true",
                     help="run only the tests that start no process and no browser (bash scripts/dev.sh test --fast); "
                          "a test that starts one anyway fails")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") == "loadgroup" and "_nodeid" not in pytest.Item.nodeid.fget.__code__.co_names:
        # xdist puts each test's group into its id through Node._nodeid; pytest 9.2 keeps the id
        # elsewhere, and xdist would then hand a module's tests to every worker, silently, each
        # running the module's job again
        raise pytest.UsageError(f"pytest {pytest.__version__} keeps pytest-xdist from grouping the tests that share a "
                                "module's job: install the pytest that pyproject.toml's test extra pins")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        lo = PORTS_BASE + int(worker[2:]) * PORTS_PER_WORKER
        os.environ[RANGE_VARIABLE] = f"{lo}-{lo + PORTS_PER_WORKER - 1}"


# ---- which tests run, where, and in what order --------------------------------------------------

def _shared_fixtures(item: pytest.Item) -> list[str]:
    """The module- (or class-, package-) scoped fixtures `item` uses: what it shares with its neighbours."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [name for name, defs in info.name2fixturedefs.items() if defs and defs[-1].scope in ("module", "class", "package")]


def _groups(items: list[pytest.Item]) -> dict[str, str]:
    """nodeid -> group, for the tests that must run in one worker: per module, those joined by a
    module-scoped fixture they share (so each such fixture is set up once in the run)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    members: dict[str, list[str]] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for name in _shared_fixtures(item):
            key = f"{module}::{name}"
            members.setdefault(key, []).append(item.nodeid)
            parent[find(item.nodeid)] = find(key)
    return {nodeid: find(nodeid) for ids in members.values() for nodeid in ids}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/browser/"):
            item.add_marker(pytest.mark.browser)
    if config.getoption("--no-processes"):
        keep = [i for i in items if not i.get_closest_marker("proc") and not i.get_closest_marker("browser")]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
        return
    groups = _groups(items)
    for item in items:
        if item.nodeid in groups:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))

    # Processes first, then the browser, then the rest: the long units start while every worker
    # is free, and the many short in-process tests even out the end. Stable within each kind,
    # so a group's tests stay in file order.
    def kind(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("proc") else 1 if item.get_closest_marker("browser") else 2

    items.sort(key=kind)


# ---- --no-processes: a test that starts a process fails ------------------------------------------

class ProcessStarted(RuntimeError):
    pass


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ProcessStarted(f"this test started a process ({what}) under --no-processes: "
                             "mark it @pytest.mark.proc (or its module: pytestmark = pytest.mark.proc)")
    return refuse


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not item.config.getoption("--no-processes"):
        yield
        return
    import multiprocessing.util
    import platform

    platform.processor()  # asked by torch once and cached, through `uname -p`: the harness's process, not the test's

    mp = pytest.MonkeyPatch()
    mp.setattr(subprocess.Popen, "_execute_child", _refuse("subprocess"))
    mp.setattr(multiprocessing.util, "spawnv_passfds", _refuse("multiprocessing"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            mp.setattr(os, name, _refuse(f"os.{name}"))
    try:
        yield
    finally:
        mp.undo()


# ---- jobs made once per run ------------------------------------------------------------------------

class SharedRuns:
    """Folders made once per test run and read by every worker that asks for them.

    `folder(key, make)` calls ``make(folder)`` the first time any worker asks for `key` (the
    others wait on a file lock) and returns the folder; what `make` returns (JSON) is kept beside
    it and given back by `result(key)`. A failed `make` leaves nothing, so the next asker tries
    again and fails the same way, in its own test. Readers never write into the folder: a test
    that needs its own variant makes it in its own tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def folder(self, key: str, make: Callable[[Path], Any]) -> Path:
        from filelock import FileLock

        target, done = self.root / key, self.root / f"{key}.result.json"
        with FileLock(str(self.root / f"{key}.lock")):
            if not done.exists():
                if target.exists():
                    import shutil

                    shutil.rmtree(target)
                target.mkdir(parents=True)
                result = make(target)
                tmp = done.with_suffix(".tmp")
                tmp.write_text(json.dumps(result))
                tmp.replace(done)
        return target

    def result(self, key: str) -> Any:
        return json.loads((self.root / f"{key}.result.json").read_text())


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    """The run's folders made once for all workers (xdist's workers share their base temp's parent)."""
    base = tmp_path_factory.getbasetemp()
    return SharedRuns((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared")


# ---- the simulated world -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def world() -> int:
    from commdebug.demo import init_fake_world

    init_fake_world(WORLD)
    return WORLD


@pytest.fixture(scope="session")
def mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


@pytest.fixture
def tp_transformer(world):
    """A fresh 2-layer tensor-parallel transformer and its input tokens."""
    from commdebug.demo import ModelConfig, tensor_parallel_transformer

    def make(**cfg):
        model = tensor_parallel_transformer(ModelConfig(**{"n_layers": 2, **cfg}), world)
        tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
        return model, tokens

    return make


def plain_counts(module_counts) -> dict:
    """comm_module_counts with op keys as text and zero entries dropped, for comparisons."""
    return {
        fqn: {phase: {str(k): v for k, v in ops.items() if v} for phase, ops in phases.items()}
        for fqn, phases in module_counts.items()
    }


@pytest.fixture
def in_process_cli(capsys: pytest.CaptureFixture) -> Callable[..., subprocess.CompletedProcess]:
    """``commdebug ARGS`` run in this process, for the offline verbs (they start no process
    group): its exit status, stdout and stderr, as a CompletedProcess, without an interpreter's
    start per call."""
    from commdebug.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        status = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["commdebug", *args], status, out, err)

    return run
