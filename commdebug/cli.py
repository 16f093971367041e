"""``commdebug <verb>``: wiring only; the work lives in the modules it calls. The grammar
(verbs, options, help, exit statuses) is in :mod:`commdebug.cli_options`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commdebug.cli_options import (  # noqa: F401  # re-exported: scripts/gen_cli_docs.py and tests read them here
    DUMP_HELP,
    DUMPS_HELP,
    ERROR,
    EXIT_STATUS_DOC,
    FOUND,
    HIDDEN_VERBS,
    OK,
    UsageError,
    _parser,
)
from commdebug.errors import CommDebugError

__all__ = ["main"]


def _selection(args: argparse.Namespace) -> tuple[Any, Any]:
    from commdebug.formats.selection import selections  # a bad value: one error line before any file is read

    return selections(getattr(args, "ranks", None), getattr(args, "steps", None))


def _meter(args: argparse.Namespace) -> Any:
    from commdebug.render.progress import Progress  # on stderr when a terminal, unless --quiet

    return Progress.for_stream(sys.stderr, quiet=getattr(args, "quiet", False))


def _open(path: Path) -> None:
    import webbrowser  # only when a page is opened: its import is a tenth of a verb's start

    if not webbrowser.open(path.resolve().as_uri()):
        print(f"commdebug: no browser to open; open {path} yourself", file=sys.stderr)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=1, sort_keys=False) + "\n")


def _show(result: Any, render: Callable[[Any], str], as_json: bool) -> None:
    """An analysis result as JSON (its ``to_dict()``) or as its renderer's text."""
    if as_json:
        _print_json(result.to_dict())
    else:
        sys.stdout.write(render(result))


def _demo(args: argparse.Namespace) -> int:
    from commdebug.demo import run_demo

    run_demo(args.world_size, args.layers, args.steps, args.out, args.noise_level, args.checkpoint)
    return OK


def _view(args: argparse.Namespace) -> int:
    import visualizer
    from commdebug.analysis.rank_modules import rank_modules
    from commdebug.fileio import output_file, write_output
    from commdebug.formats.folders import common_folder, one_file
    from commdebug.formats.readers import load

    cluster = _cluster(args.cluster)
    ranks, steps = _selection(args)
    single = one_file(args.dumps) if args.dumps else None
    if not (ranks.everything and steps.everything) and (not args.dumps or single is not None):
        raise UsageError("--ranks and --steps choose from a folder of rank dumps: commdebug view FOLDER --ranks 0-7")
    unread: list[str] = []
    if not args.dumps:
        if cluster is not None:
            raise UsageError("--cluster needs a dump: commdebug view DUMP --cluster NAME|FILE")
        out = output_file(args.out or "commdebug_viewer.html", "HTML file")
        write_output(out, visualizer.render_html(None))
    elif single is None:
        src = common_folder(args.dumps)
        if cluster is not None:
            raise UsageError(f"{src}: --cluster works with one dump; the folder page shows no predictions yet")
        out = output_file(args.out or src / "index.html", "HTML file")
        with _meter(args) as meter:
            folder = rank_modules(args.dumps, ranks=ranks, steps=steps, progress=meter, jobs=args.jobs)
        write_output(out, visualizer.render_ranks_html(folder, title=f"commdebug: {src.name or src.resolve().name}"))
        unread = folder.errors
    else:
        src = single
        trace = load(src)
        name = args.out if args.out is not None else str(src.with_suffix(".html"))
        out = output_file(_expand(name, trace.metadata), "HTML file")
        if out.resolve() == src.resolve():
            raise CommDebugError(f"{out}: the output would overwrite the dump; choose another -o")
        write_output(out, visualizer.render_html(trace, title=f"commdebug: {src.name}", cluster=cluster))
    print(out)
    for problem in unread:  # the page shows the readable ranks; the terminal must not look clean
        print(f"commdebug: error: {problem}", file=sys.stderr)
    if args.open:
        _open(out)
    return ERROR if unread else OK


def _expand(name: str, meta: dict[str, Any]) -> str:
    from commdebug.fileio import expand_placeholders

    return expand_placeholders(name, int(meta.get("rank") or 0), int(meta.get("world_size") or 1))


def _table(args: argparse.Namespace) -> int:
    from commdebug.analysis.predicted import trace_predictions
    from commdebug.formats.readers import load
    from commdebug.render.table import render_table

    cluster = _cluster(args.cluster)
    trace = load(_single_dump(args.dump, "table"))
    predicted = None
    if args.noise_level >= 1:
        predicted = trace_predictions(trace, cluster)
    elif cluster is not None:
        print("commdebug: note: predicted times show at --noise-level 1 and above", file=sys.stderr)
    sys.stdout.write(render_table(trace, args.noise_level, predicted=predicted))
    return OK


def _single_dump(dumps: Any, verb: str) -> Path:
    from commdebug.formats.folders import as_paths, one_file, rank_files

    single = one_file(dumps)
    if single is None:
        paths = as_paths(dumps)
        rank_files(paths)  # a folder with no dumps says so, as every verb does
        p = paths[0]
        raise CommDebugError(f"{' '.join(map(str, paths))}: {'is a folder' if len(paths) == 1 else 'are several'}; "
                             f"`commdebug {verb}` reads one dump (give one rank's, e.g. {p / 'rank0.json'})")
    return single


def _summary(args: argparse.Namespace) -> int:
    from commdebug.analysis.summary import parse_by, summarize_path
    from commdebug.render.summary import render_summary, summary_dict

    if args.by.strip() == "peer":
        from commdebug.analysis.traffic import peer_rows_path
        from commdebug.render.summary import peers_dict, render_peers

        rows = peer_rows_path(args.dumps, rank=args.rank, jobs=args.jobs)
        _print_json(peers_dict(rows)) if args.json else sys.stdout.write(render_peers(rows))
        return OK
    by = parse_by(args.by)  # a bad --by fails before the file is read
    cluster = _cluster(args.cluster)
    with _meter(args) as meter:
        summary = summarize_path(args.dumps, by, cluster, rank=args.rank, progress=meter, jobs=args.jobs)
    if args.json:
        _print_json(summary_dict(summary, header=args.header))
    else:
        sys.stdout.write(render_summary(summary, header=args.header))
    return OK


def _cluster(spec: str | None) -> Any:
    """The cluster a ``--cluster`` (or ``--base``) option names, loaded now: a name that is no
    preset and no valid cluster file is a usage error, told before any dump is read."""
    if spec is None:
        return None
    from commdebug.estimate import load_cluster
    from commdebug.estimate.cluster import ClusterError

    try:
        return load_cluster(spec)
    except ClusterError as e:
        raise UsageError(str(e)) from None


def _estimate(args: argparse.Namespace) -> int:
    from commdebug.analysis.summary import parse_by, summarize
    from commdebug.estimate import PRESETS
    from commdebug.formats.readers import load
    from commdebug.render.estimate import estimate_dict, render_estimate, render_presets

    if args.list:
        if args.json:
            _print_json([c.to_dict() for c in PRESETS.values()])
        else:
            sys.stdout.write(render_presets(PRESETS.values()))
        return OK
    if not args.dumps:
        raise CommDebugError("give a dump: commdebug estimate DUMPS --cluster NAME|FILE  (or --list)")
    by = parse_by(args.by or "op")
    cluster = _cluster(args.cluster)
    from commdebug.analysis.predicted import COMPARE_BY, compare_path
    from commdebug.render.compare import comparison_dict, render_comparison
    comparison = compare_path(args.dumps, cluster, by=COMPARE_BY + ((by,) if args.by and by not in COMPARE_BY else ()), ranks_per_node=args.ranks_per_node)
    if comparison is not None:  # a timed run: measured beside predicted
        _print_json(comparison_dict(comparison)) if args.json else sys.stdout.write(render_comparison(comparison))
        return OK
    trace_path = _single_dump(args.dumps, "estimate")
    trace = load(trace_path)
    if cluster is None and trace.metadata.get("cluster") is None:
        raise CommDebugError(f"{trace_path}: no cluster to predict on: give --cluster NAME|FILE (presets: {', '.join(PRESETS)})")
    summary = summarize(trace, by, cluster, args.ranks_per_node)
    steps = summarize(trace, "step", cluster, args.ranks_per_node)
    if args.json:
        _print_json(estimate_dict(summary, steps))
    else:
        sys.stdout.write(render_estimate(summary, steps))
    return OK


def _calibrate(args: argparse.Namespace) -> int:
    from commdebug.analysis.predicted import calibration_inputs
    from commdebug.estimate.calibrate import calibrate
    from commdebug.fileio import output_file, write_output

    out = output_file(args.out, "cluster file")
    base = _cluster(args.base)
    cluster, notes = calibrate(calibration_inputs(args.files), gpus_per_node=args.gpus_per_node, base=base, name=args.name, statistic=args.statistic)
    for note in notes:
        print(f"commdebug: {note}", file=sys.stderr)
    path = write_output(out, json.dumps(cluster.to_dict(), indent=1) + "\n")
    i, n = cluster.intra_node, cluster.network
    print(f"wrote {path}: intra_node {i.busbw_gbps:.1f} GB/s, {i.latency_us:.1f} us; network {n.busbw_gbps:.1f} GB/s per GPU, {n.latency_us:.1f} us; {cluster.gpus_per_node} GPUs per node; {len(cluster.curves)} measured curves")
    return OK


def _run(args: argparse.Namespace) -> int:
    from commdebug.launch.run import run_program

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        raise CommDebugError("no program to run: commdebug run [options] -- script.py [args...]  (or -m module [args...])")
    options: dict[str, Any] = {}
    if args.timing:
        options["timing"] = args.timing
    if args.start_step is not None:
        options["start_step"] = args.start_step
    if args.end_step is not None:
        options["end_step"] = args.end_step
    if args.ops:
        options["ops"] = [op.strip() for op in args.ops.split(",") if op.strip()]
    if args.light or args.detail_every is not None:
        options["light"] = True
    if args.detail_every is not None:
        options["detail_every"] = args.detail_every
    for name in ("keep_steps", "stream", "metrics_port", "metrics_push", "debug_server", "profile_steps"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return run_program(program, args.module, args.out, hang_timeout=args.hang_timeout, noise_level=args.noise_level, **options)


def _hook(args: argparse.Namespace) -> int:
    from commdebug.launch import hook

    if args.action == "install":
        path = hook.install(args.site_dir)
        print(f"installed {path}\nrecord any program in this environment with: COMMDEBUG=1 COMMDEBUG_OUT=traces/ <your launch line>")
    elif args.action == "uninstall":
        removed = hook.uninstall(args.site_dir)
        print(f"removed {removed}" if removed is not None else f"not installed ({hook.hook_path(args.site_dir)} does not exist)")
    else:
        path = hook.hook_path(args.site_dir)
        print(f"installed: {path}" if hook.installed(args.site_dir) else f"not installed ({path})")
    return OK


def _report(args: argparse.Namespace) -> int:
    from commdebug.analysis.gap_ops import ProfileGaps
    from commdebug.analysis.report import rank_digest, report
    from commdebug.formats.folders import find_job
    from commdebug.formats.selection import pick, read_views
    from commdebug.render.report import render_report, shown_ranks

    ranks, steps = _selection(args)
    job = find_job(args.dumps)
    with _meter(args) as meter:
        result = report(read_views(pick(job.files, ranks), ranks, steps, progress=meter, jobs=args.jobs, digest=rank_digest),
                        chosen=ranks.describe(), late_threshold=args.late_threshold, gap_ops=ProfileGaps(job.files),
                        scope=job.scope)
    if args.json:
        _print_json(result.to_dict(top=args.top))
    else:
        sys.stdout.write(render_report(result, top=shown_ranks(len(result.ranks), args.top)))
    return OK


def _check(args: argparse.Namespace) -> int:
    from commdebug.analysis.check import check, rank_digest
    from commdebug.formats.folders import dumps_name, find_job
    from commdebug.formats.selection import read_views
    from commdebug.render.check import no_verdict, render_check

    job = find_job(args.dumps)
    with _meter(args) as meter:
        result = check(read_views(job.files, progress=meter, jobs=args.jobs, digest=rank_digest), job.scope)
    why = no_verdict(result)
    if why is not None:  # no verdict at all rather than "consistent" on nothing
        raise CommDebugError(f"{dumps_name(args.dumps)}: {why}")
    _show(result, render_check, args.json)
    return OK if result.consistent else FOUND


def _diff(args: argparse.Namespace) -> int:
    from commdebug.analysis.diff import diff_paths
    from commdebug.render.diff import render_diff

    with _meter(args) as meter:
        diffs = list(diff_paths(args.before, args.after, ignore_groups=args.ignore_groups, progress=meter))
    found = any(diffs)
    if args.json:
        rows = [c.to_dict() for d in diffs for c in d.changes]
        reorders = [r.to_dict() for d in diffs for r in d.reorders]
        # "a" and "b": the JSON keys predate BEFORE AFTER and stay, as documented
        _print_json({"a": args.before, "b": args.after, "same": not found, "changes": rows, "reorders": reorders,
                     "rolled_up_modules": sum(d.rolled_up for d in diffs),
                     "endings": [{"rank": d.rank, "a": d.ended[0], "b": d.ended[1]} for d in diffs if d.ended is not None]})
        return FOUND if found else OK
    sys.stdout.write(render_diff(diffs, args.before, args.after))
    return FOUND if found else OK


def _trace(args: argparse.Namespace) -> int:
    from commdebug.analysis.clocks import align_clocks, clock_digest
    from commdebug.fileio import output_file
    from commdebug.formats.folders import dump_files
    from commdebug.formats.output import write_text_or_gzip
    from commdebug.formats.selection import pick, read_views
    from commdebug.render.chrome_trace import ChromeTrace, trace_summary

    ranks, steps = _selection(args)
    out = output_file(args.out, "trace file")
    files = dump_files(args.dumps)
    chosen = pick(files, ranks)
    # two reads: the ranks' clocks first (a few numbers each), then their events on that clock
    clocks = align_clocks(read_views(chosen, ranks, jobs=args.jobs, digest=clock_digest))
    chrome = ChromeTrace(_cluster(args.cluster), steps=None if steps.everything else steps, flows=args.flows, clocks=clocks)
    with _meter(args) as meter:
        write_text_or_gzip(out, chrome.render(read_views(chosen, ranks, progress=meter, jobs=args.jobs, digest=chrome.digest)))
    print("\n".join(trace_summary(chrome.counts, out, ranks_in_folder=len(files), ranks=ranks.describe(), steps=steps.describe(),
                                  clocks=clocks)))
    return OK


def _overlap(args: argparse.Namespace) -> int:
    from commdebug.analysis.overlap import check_by, overlap_path

    by = check_by(args.by)  # a bad grouping fails before any file is read
    with _meter(args) as meter:
        result = overlap_path(args.dumps, by, round_us=args.round_us, jobs=args.jobs, progress=meter)
    _show(result, _render_overlap, args.json)
    return OK


def _render_overlap(result: Any) -> str:
    from commdebug.render.overlap import render_overlap  # for text only: --json does without it

    return render_overlap(result)


def _watch(args: argparse.Namespace) -> int:
    import time

    from commdebug.analysis.watch import job_started, watch_path
    from commdebug.formats.folders import as_paths, dumps_name
    from commdebug.render.watch import render_watch

    name = dumps_name(args.dumps)
    if not (args.once or args.json) and not job_started(args.dumps):
        # started before the job, as one would in a second terminal: wait for it to appear
        print(f"commdebug watch: waiting for {name} and the first rank's stream (Ctrl-C to stop)", flush=True)
        while not job_started(args.dumps):
            time.sleep(args.interval)
    for p in as_paths(args.dumps):
        _watched_folder(p)
    while True:
        result = watch_path(args.dumps, stall_after=args.stall_after, behind_pct=args.behind_pct)
        if args.once or args.json:
            _show(result, lambda r: render_watch(r, name), args.json)
            return OK if result.healthy else FOUND
        stop = result.over and not args.follow
        if stop:  # read once more: a rank seen gone an instant before its final dump landed
            result = watch_path(args.dumps, stall_after=args.stall_after, behind_pct=args.behind_pct)
            stop = result.over
        sys.stdout.write("\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n")  # a new frame in place
        sys.stdout.write(render_watch(result, name))
        sys.stdout.flush()
        if stop:
            return OK if result.healthy else FOUND
        time.sleep(args.interval)


def _watched_folder(p: Path) -> None:
    """Refuse what `watch` cannot watch, in the words every verb uses for the same input."""
    from commdebug.errors import empty_file, missing_path

    if not p.exists():
        raise missing_path(p)
    if not p.is_dir():
        if p.is_file() and p.stat().st_size == 0:
            raise empty_file(p)
        raise CommDebugError(f"{p}: not a folder; `commdebug watch` reads the folder a job streams into")


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo, "view": _view, "viewer": _view, "table": _table, "summary": _summary, "run": _run,
    "hook": _hook, "report": _report, "check": _check, "diff": _diff, "trace": _trace,
    "estimate": _estimate, "calibrate": _calibrate, "watch": _watch, "overlap": _overlap,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argv[0] if argv and argv[0] in VERBS else None).parse_args(argv)
    try:
        status = VERBS[args.verb](args)
        if not sys.stdout.closed:  # a program under `run` may have closed it
            sys.stdout.flush()
        return status
    except BrokenPipeError:
        # `commdebug demo | head`: the reader left; end quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK
    except CommDebugError as e:  # UsageError too
        print(f"commdebug: error: {e}", file=sys.stderr)
        return ERROR
    except OSError as e:
        print(f"commdebug: error: {e.strerror or e}{': ' + e.filename if getattr(e, 'filename', None) else ''}", file=sys.stderr)
        return ERROR
    except KeyboardInterrupt:
        print("commdebug: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
