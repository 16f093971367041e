"""``commdebug <verb>``: wiring only; the work lives in the modules it calls."""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path

from commdebug.errors import CommDebugError

__all__ = ["main"]


def _noise(value: str) -> int:
    level = int(value)
    if not 0 <= level <= 3:
        raise argparse.ArgumentTypeError("must be 0, 1, 2 or 3")
    return level


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commdebug", description="See every collective a PyTorch distributed program issues.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    demo = verbs.add_parser("demo", help="trace a tensor-parallel transformer on a simulated world; print the table, write JSON and HTML")
    demo.add_argument("--world-size", type=int, default=8, help="simulated ranks (default 8)")
    demo.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    demo.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    demo.add_argument("--checkpoint", action="store_true", help="activation-checkpoint every layer")
    demo.add_argument("--noise-level", type=_noise, default=0, help="table noise level 0-3 (default 0)")
    demo.add_argument("--out-dir", type=Path, default=Path("commdebug_demo"), help="where to write the files (default ./commdebug_demo)")

    view = verbs.add_parser("view", help="write the HTML viewer of a JSON dump (ours or torch's CommDebugMode's)")
    view.add_argument("dump", type=Path)
    view.add_argument("-o", "--output", type=Path, help="HTML file (default: the dump's name with .html)")
    view.add_argument("--open", action="store_true", help="open it in the browser")

    viewer = verbs.add_parser("viewer", help="write an empty viewer: drop any dump on it")
    viewer.add_argument("-o", "--output", type=Path, default=Path("commdebug_viewer.html"))
    viewer.add_argument("--open", action="store_true")

    table = verbs.add_parser("table", help="print the tracing table of a JSON dump")
    table.add_argument("dump", type=Path)
    table.add_argument("--noise-level", type=_noise, default=0)
    return parser


def _open(path: Path) -> None:
    if not webbrowser.open(path.resolve().as_uri()):
        print(f"commdebug: no browser to open; open {path} yourself", file=sys.stderr)


def _demo(args: argparse.Namespace) -> None:
    from commdebug.demo import run_demo

    run_demo(args.world_size, args.layers, args.steps, args.out_dir, args.noise_level, args.checkpoint)


def _view(args: argparse.Namespace) -> None:
    import visualizer
    from commdebug.model.dump import from_dump_dict, read_dump_json

    data = read_dump_json(args.dump)
    from_dump_dict(data, str(args.dump))  # refuse what the page could not show
    out = args.output or args.dump.with_suffix(".html")
    if out.resolve() == args.dump.resolve():
        raise CommDebugError(f"{out}: the output would overwrite the dump; choose another -o")
    path = visualizer.write_html(out, data, title=f"commdebug: {args.dump.name}")
    print(path)
    if args.open:
        _open(path)


def _viewer(args: argparse.Namespace) -> None:
    import visualizer

    path = visualizer.write_html(args.output, None)
    print(path)
    if args.open:
        _open(path)


def _table(args: argparse.Namespace) -> None:
    from commdebug.model.dump import load
    from commdebug.render.table import render_table

    sys.stdout.write(render_table(load(args.dump), args.noise_level))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        {"demo": _demo, "view": _view, "viewer": _viewer, "table": _table}[args.verb](args)
    except CommDebugError as e:
        print(f"commdebug: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"commdebug: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
