"""Folder-page first paint for 64 ranks of a 96-layer tensor-parallel transformer (target: the
first tree level painted under 1 s after navigation start in headless Chromium), or for a wide
job: ``--ranks 1024 --layers 2 --steps 100`` is issue 19's 1,024 ranks x 100 steps, whose first
view includes the rank x step heatmap (``--slow R:S`` makes rank R five times slower at step S,
the outlier the heatmap must mark).

Writes a synthetic job (tests/synthetic.py.write_rank_dumps: 64 per-rank schema-2 dumps of one
training step, TP groups of 8, every rank a little slower than the last, and with --mismatch one
rank issuing one call twice as large), builds the page with visualizer.write_ranks_html, and
opens it in a fresh headless Chromium per run so every load is cold. The page stamps
window.__commdebugReady once the tree's first level is in the DOM and window.__commdebugPainted
in the first task after the next frame (the frame that shows it); the bench also waits for the
first tree row to be visible. Prints the folder and page sizes, the time to write the page, and
per run the parse, DOM and paint times from navigation start, with the worst run's ratio to the
target.

    python bench/viewer_ranks.py [--ranks 64] [--layers 96] [--runs 5] [--mismatch] [--folder DIR]
    python bench/viewer_ranks.py --ranks 1024 --layers 2 --steps 100 --slow 700:42 --runs 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

try:
    import visualizer
except ImportError:  # a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import visualizer
# the synthetic dumps are test scaffolding: they live beside the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from coldload import cold_loads, verdict

from synthetic import write_rank_dumps

TIMINGS = """() => {
    const parsed = performance.getEntriesByName("commdebug:parsed")[0];
    return {parsed: parsed ? parsed.startTime : null, ready: window.__commdebugReady,
            painted: window.__commdebugPainted ?? null, visible: performance.now(),
            rows: document.querySelectorAll("#tree li.node").length,
            ranks: document.querySelectorAll("#rank-select option").length,
            findings: document.querySelectorAll("#findings-list > li").length,
            cells: document.querySelectorAll('[data-testid="rank-step-heatmap"] .cell').length,
            outliers: [...document.querySelectorAll('[data-testid="rank-step-heatmap"] .cell.outlier')]
              .map((c) => `${c.dataset.rank}:${c.dataset.step}`).join(" "),
            heatmap_ms: (performance.getEntriesByName("commdebug:heatmap")[0] || {}).duration ?? null};
}"""


def slow_down(path: Path, step: int, factor: float) -> None:
    """Make one rank's dump `factor` times slower at `step`."""
    import json

    dump = json.loads(path.read_text())
    columns = dump["commdebug"]["events"]["columns"]
    columns["latency_s"] = [lat * factor if s == step else lat for lat, s in zip(columns["latency_s"], columns["step"], strict=True)]
    path.write_text(json.dumps(dump))


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix == ".json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mismatch", action="store_true", help="plant a mismatch on the last rank")
    parser.add_argument("--folder", type=Path, help="time this folder of rank dumps instead")
    parser.add_argument("--slow", default=None, metavar="R:S", help="make rank R five times slower at step S")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder
        if folder is None:
            folder = Path(tmp) / "traces"
            t0 = time.perf_counter()
            odd = {"odd_rank": args.ranks - 1, "odd_module": "Transformer.layers.1.attention.wo"} if args.mismatch else {}
            write_rank_dumps(folder, ranks=args.ranks, layers=args.layers, steps=args.steps, **odd)
            if args.slow:
                rank, step = (int(x) for x in args.slow.split(":"))
                slow_down(folder / f"rank{rank}.json", step, 5.0)
            print(f"folder: {args.ranks} synthetic ranks of a {args.layers}-layer TP transformer, {args.steps} step(s): "
                  f"{folder_size(folder) / 2**20:.1f} MiB of dumps, written in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        page_path = visualizer.write_ranks_html(Path(tmp) / "ranks.html", folder)
        write_s = time.perf_counter() - t0
        size = page_path.stat().st_size
        print(f"page: {size / 2**20:.2f} MiB ({size:,} bytes), written in {write_s:.1f} s")
        results = cold_loads(page_path, args.runs, args.chromium, wait_for="#tree li.node", timings_js=TIMINGS, visible=True, until="painted")

    for i, r in enumerate(results):
        heat = f", heatmap of {r['cells']} cells drawn in {r['heatmap_ms'] or 0:.0f} ms, outliers {r['outliers'] or 'none'}" if r["cells"] else ""
        print(f"run {i}: index parsed at {r['parsed']:.0f} ms, first level ({r['rows']} rows, {r['ranks']} ranks, "
              f"{r['findings']} findings{heat}) in the DOM at {r['ready']:.0f} ms, painted at {r['painted']:.0f} ms")
    painted = [r["painted"] for r in results]
    print(verdict(painted, "first paint of the tree"))


if __name__ == "__main__":
    main()
