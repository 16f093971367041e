"""Write docs/img/viewer.png, the README's picture of the viewer, from a real run: the demo's
tensor-parallel transformer (2 layers, 2 steps, 8 simulated ranks), its page opened in headless
Chromium (Debian's, as the browser tests use), the tree expanded and one layer selected.

    python scripts/screenshot.py [-o docs/img/viewer.png]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu"]


def main() -> int:
    ap = argparse.ArgumentParser(description="write the README's screenshot of the viewer")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "img" / "viewer.png", help="PNG file (default docs/img/viewer.png)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from commdebug.demo import run_demo

    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.redirect_stdout(io.StringIO()):
            paths = run_demo(world_size=8, layers=2, steps=2, out_dir=tmp)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 820}, device_scale_factor=1)
            page.goto(Path(paths["html"]).as_uri())
            page.wait_for_selector("body:not([data-state=loading])", state="attached")
            page.click("#expand-all")
            # select a layer's attention so the detail panel shows its collectives
            page.locator("#tree li.node[data-fqn$='layers.0.attention'] .name").first.click()
            args.output.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.output))
            browser.close()
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
