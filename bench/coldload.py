"""Cold page loads in headless Chromium, shared by the viewer benches: a fresh browser per run,
so no run profits from the previous one's caches.

    results = cold_loads(page, runs=5, chromium="/usr/bin/chromium",
                         wait_for="#tree li.node", timings_js=TIMINGS)
    print(verdict([r["ready"] for r in results], "first draw"))
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

TARGET_MS = 1000.0
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def cold_loads(page_path: Path, runs: int, chromium: str, *, wait_for: str, timings_js: str,
               visible: bool = False, until: str | None = None) -> list[dict]:
    """Open ``page_path`` ``runs`` times, each in a new browser; wait for ``wait_for`` (attached,
    or visible with ``visible``), exit with the page's error unless it reached data-state ready,
    and collect ``timings_js``'s result, once its ``until`` key is set (a stamp the page makes in
    a later task, e.g. after the next frame; a busy machine can take a while)."""
    from playwright.sync_api import sync_playwright

    results = []
    with sync_playwright() as pw:
        for _ in range(runs):
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(page_path.as_uri())
            # Not wait_for_function: its polling evaluates strings, which the page's CSP refuses.
            page.wait_for_selector(wait_for, state="visible" if visible else "attached", timeout=60_000)
            state = page.get_attribute("body", "data-state")
            if state != "ready":
                sys.exit(f"the page did not draw (state {state}): {page.text_content('#error')}")
            result = page.evaluate(timings_js)
            for _ in range(500):
                if until is None or result.get(until) is not None:
                    break
                page.wait_for_timeout(20)
                result = page.evaluate(timings_js)
            else:
                sys.exit(f"the page never set {until} (10 s)")
            results.append(result)
            browser.close()
    return results


def verdict(times_ms: list[float], what: str) -> str:
    """``what: median M ms, worst W ms; target 1000 ms; worst/target = R (within target)``."""
    worst = max(times_ms)
    return (f"{what}: median {statistics.median(times_ms):.0f} ms, worst {worst:.0f} ms; "
            f"target {TARGET_MS:.0f} ms; worst/target = {worst / TARGET_MS:.2f} "
            f"({'within' if worst < TARGET_MS else 'OVER'} target)")
