"""Fixtures for the viewer's browser tests.

One headless Chromium per session (the machine is small); each test gets a fresh page that fails
the test on any console error or uncaught exception, and a `viewer` helper to open dumps in it.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from visualizer import write_html, write_ranks_html

from synthetic import to_reference, transformer_dump

CHROMIUM = os.environ.get("COMMDEBUG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).parent / "artifacts"


@pytest.fixture(scope="session")
def browser():
    # A missing browser fails the run rather than skipping it: a green run must mean the page
    # was tested. `bash scripts/dev.sh test` installs both.
    from playwright import sync_api

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium, or set COMMDEBUG_CHROMIUM")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    yield page
    context.close()
    assert not errors, f"console errors: {errors}"


def ranks_page_file(tmp_path_factory, folder: Path) -> Path:
    """The folder page of the rank dumps in `folder`, written once for a test module."""
    return write_ranks_html(tmp_path_factory.mktemp("page") / "index.html", folder)


def open_ready(page, page_file: Path):
    """`page` showing `page_file` at a wide viewport, once its data has loaded."""
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(page_file.as_uri())
    page.wait_for_selector("body:not([data-state=loading])", state="attached")
    assert page.evaluate("document.body.dataset.state") == "ready"
    return page


@pytest.fixture(scope="module")
def page_file(job, tmp_path_factory) -> Path:
    """The folder page of the test module's own `job` fixture (a synthetic rank folder), written once."""
    return ranks_page_file(tmp_path_factory, job.folder)


@pytest.fixture
def ranks_page(page, page_file):
    """The test module's folder page, open and ready."""
    return open_ready(page, page_file)


class Viewer:
    """The viewer page under test: opens dumps and finds its parts by their stable ids."""

    def __init__(self, page, directory: Path) -> None:
        self.page = page
        self.directory = directory

    def open(self, dump: dict | None, *, title: str = "commdebug", name: str = "viewer.html"):
        path = write_html(self.directory / name, dump, title=title)
        self.page.goto(path.as_uri())
        # Not wait_for_function: its polling evaluates strings, which the page's CSP refuses.
        self.page.wait_for_selector("body:not([data-state=loading])", state="attached")
        return self.page

    def open_ranks(self, folder: Path, *, name: str = "ranks.html", title: str | None = None):
        """Open the folder page of the rank dumps in `folder`."""
        path = write_ranks_html(self.directory / name, folder, title=title)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body:not([data-state=loading])", state="attached")
        return self.page

    def state(self) -> str:
        return self.page.evaluate("document.body.dataset.state")

    def row(self, fqn: str):
        """The tree row of module `fqn` (its own row, not its children's)."""
        quoted = fqn.replace("\\", "\\\\").replace('"', '\\"')
        return self.page.locator(f'#tree li.node[data-fqn="{quoted}"] > .row')

    def drawn(self) -> list[str]:
        """fqns of the tree rows in the DOM, visible or not, in document order."""
        return self.page.eval_on_selector_all("#tree li.node", "els => els.map(e => e.dataset.fqn)")

    def shown(self) -> list[str]:
        """fqns of the tree rows a user can see, in order."""
        return self.page.eval_on_selector_all(
            "#tree li.node > .row", "els => els.filter(e => e.offsetParent).map(e => e.parentNode.dataset.fqn)")

    COLUMNS = ["Module", "fwd", "bwd", "ckpt", "opt", "bytes", "share"]

    def cells(self) -> dict[str, dict[str, str]]:
        """Per drawn row: its count and bytes cells' text, by position under the column heads."""
        assert self.page.eval_on_selector_all(".tree-head > span", "s => s.map(e => e.textContent)") == self.COLUMNS
        return self.page.eval_on_selector_all("#tree li.node", """els => Object.fromEntries(els.map(li => {
            const [, forward, backward, checkpoint, optimizer, bytes, share] = li.querySelector(':scope > .row').children;
            return [li.dataset.fqn, {
              forward: forward.textContent, backward: backward.textContent,
              checkpoint: checkpoint.textContent, optimizer: optimizer.textContent, bytes: bytes.textContent,
              data_bytes: bytes.dataset.bytes, share: share.dataset.share}];
          }))""")

    def select(self, fqn: str) -> None:
        """Select a drawn module by clicking its row outside the name (no toggling)."""
        self.row(fqn).locator(".bytes").click()
        self.page.locator("#detail-fqn").filter(has_text=fqn).wait_for()

    def expand_all(self) -> None:
        self.page.click("#expand-all")

    def table(self, table_id: str) -> list[list[str]]:
        return self.page.eval_on_selector_all(
            f"#{table_id} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")


@pytest.fixture
def viewer(page, tmp_path) -> Viewer:
    return Viewer(page, tmp_path)


def _walk(node: dict):
    yield node
    for child in node["children"]:
        yield from _walk(child)


@pytest.fixture
def walk():
    """walk(dump): every node of a dump, pre-order."""
    return _walk


# Small dimensions so sizes read easily: an activation all_reduce is 32 x 64 bf16 = 4 KiB.
SMALL = {"dim": 64, "ffn": 256, "vocab": 256, "tokens": 32}


@pytest.fixture
def dump() -> dict:
    """Two steps of a 2-layer TP transformer; layer 1 is checkpointed."""
    return transformer_dump(layers=2, steps=2, **SMALL)


@pytest.fixture
def reference_dump() -> dict:
    """The same run as torch's CommDebugMode writes it, module names with '-' in them."""
    return to_reference(transformer_dump(layers=2, steps=2, root="tp-model", **SMALL))


@pytest.fixture(scope="session")
def real_dumps(shared_run) -> dict[str, dict]:
    """Dumps of real runs of the demo's tensor-parallel transformer on 8 simulated ranks:
    "commdebug", 2 training steps with checkpointed layers; "plain" and "reference", 1 step
    without, written by commdebug and by torch's CommDebugMode (which in torch 2.13 fails on
    checkpointed modules and on a second forward). Recorded once per test run, read by every worker."""
    out = shared_run.folder("real-dumps", _record_real_dumps)
    return {name: json.loads((out / f"{name}.json").read_text()) for name in ("commdebug", "plain", "reference")}


def _record_real_dumps(out: Path) -> None:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode as ReferenceMode

    from commdebug import CommDebugMode
    from commdebug.demo import ModelConfig, init_fake_world, tensor_parallel_transformer

    init_fake_world(8)
    for name, mode, steps, checkpointed in (("commdebug", CommDebugMode(), 2, True),
                                            ("plain", CommDebugMode(), 1, False),
                                            ("reference", ReferenceMode(), 1, False)):
        cfg = ModelConfig(n_layers=2, checkpoint_layers=checkpointed)
        model = tensor_parallel_transformer(cfg, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len), generator=torch.Generator().manual_seed(0))
        with mode, warnings.catch_warnings():
            # torch's tracker registers full backward hooks on modules whose inputs need no grad
            warnings.filterwarnings("ignore", "Full backward hook", UserWarning)
            for _ in range(steps):
                model(tokens).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        mode.generate_json_dump(file_name=str(out / f"{name}.json"), noise_level=3)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
