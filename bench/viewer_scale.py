"""Viewer first-draw time on a 96-layer tensor-parallel transformer dump (target: under 1 s).

Builds a synthetic schema-2 dump of 3 training steps (tests/synthetic.py: ~1.9k modules, ~20k
op rows, ~1.5k events), writes its page, and opens it in headless Chromium, a fresh browser per
run so every load is cold. The page stamps window.__commdebugReady (ms since navigation start)
once the tree's first level is in the DOM, and marks "commdebug:parsed" after JSON.parse. Prints
the file size, those times, and the worst run's ratio to the target.

With --real the dump comes from a real run instead: commdebug recording the demo's TP transformer
(checkpointed layers) on 8 simulated ranks, about 10 s for 96 layers.

    python bench/viewer_scale.py [--layers 96] [--steps 3] [--runs 5] [--real | --dump FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

try:
    import visualizer
except ImportError:  # a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import visualizer
# the synthetic dumps are test scaffolding: they live beside the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from coldload import cold_loads, verdict

from synthetic import transformer_dump

TIMINGS = """() => {
    const parsed = performance.getEntriesByName("commdebug:parsed")[0];
    return {parsed: parsed ? parsed.startTime : null, ready: window.__commdebugReady,
            rows: document.querySelectorAll("#tree li.node").length};
}"""


def census(dump: dict) -> tuple[int, int]:
    """(modules, op rows) in a dump."""
    modules = rows = 0
    stack = [dump]
    while stack:
        node = stack.pop()
        modules += 1
        rows += sum(len(node.get(k, [])) for k in
                    ("operations_forward", "operations_backward", "operations_checkpointing"))
        stack.extend(node["children"])
    return modules, rows


def real_dump(layers: int, steps: int) -> dict:
    import torch

    from commdebug import CommDebugMode
    from commdebug.demo import ModelConfig, init_fake_world, tensor_parallel_transformer

    init_fake_world(8)
    cfg = ModelConfig(n_layers=layers, checkpoint_layers=True)
    model = tensor_parallel_transformer(cfg, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    comm = CommDebugMode()
    with comm:
        for _ in range(steps):
            model(tokens).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    with tempfile.TemporaryDirectory() as tmp:
        comm.generate_json_dump(file_name=f"{tmp}/dump.json", noise_level=3)
        return json.loads(Path(f"{tmp}/dump.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--real", action="store_true", help="record a real run instead of a synthetic dump")
    source.add_argument("--dump", type=Path, help="time this JSON dump instead of a synthetic one")
    parser.add_argument("--out", type=Path, help="where to write the page (default: a temp dir)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()

    if args.dump:
        dump, what = json.loads(args.dump.read_text()), str(args.dump)
    elif args.real:
        dump, what = real_dump(args.layers, args.steps), \
            f"real run of the demo's {args.layers}-layer TP transformer, {args.steps} steps"
    else:
        dump, what = transformer_dump(layers=args.layers, steps=args.steps), \
            f"synthetic {args.layers}-layer TP transformer, {args.steps} steps"
    modules, rows = census(dump)
    raw = dump.get("commdebug", {}).get("events", [])
    events = raw.get("count", 0) if isinstance(raw, dict) else len(raw)  # schema 2 by column, 1 a list
    with tempfile.TemporaryDirectory() as tmp:
        page_path = visualizer.write_html(args.out or Path(tmp) / "viewer.html", dump)
        size = page_path.stat().st_size
        results = cold_loads(page_path, args.runs, args.chromium, wait_for="body:not([data-state=loading])", timings_js=TIMINGS)

    ready = [r["ready"] for r in results]
    print(f"dump: {what}: {modules:,} modules, {rows:,} op rows, {events:,} events")
    print(f"page: {size / 2**20:.2f} MiB ({size:,} bytes)")
    for i, r in enumerate(results):
        print(f"run {i}: JSON parsed at {r['parsed']:.0f} ms, first level ({r['rows']} rows) drawn at {r['ready']:.0f} ms")
    print(verdict(ready, "first draw"))


if __name__ == "__main__":
    main()
