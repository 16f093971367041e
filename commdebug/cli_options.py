"""The command line's grammar: every verb, option, default and help text, and the exit
statuses; :mod:`commdebug.cli` wires the parsed arguments to the modules that do the work.

docs/cli.md is generated from :func:`_parser` (scripts/gen_cli_docs.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, cast

from commdebug.errors import CommDebugError

# exit statuses: 1 is only ever a verdict (check, diff), so CI can tell a regression from a
# broken job; every error, in every verb, is 2
OK, FOUND, ERROR = 0, 1, 2
EXIT_STATUS_DOC = """
| status | meaning |
|---|---|
| 0 | done; `check`: consistent; `diff`: no difference |
| 1 | `check`: inconsistent; `diff`: differences; `watch --once`, or `watch` once every rank has ended: a rank stalled, straggling, failed or gone, or every rank hung. No other verb exits 1 on its own, so CI can tell a regression from a broken job |
| 2 | an error, in every verb: a usage error (unknown verb or option, a value out of range, a `--cluster` or `--base` naming no preset and no valid cluster file), input that cannot be read (a missing file or folder, an empty file, a folder with no rank dumps, a corrupt dump, an unknown schema, a folder mixing dumps of two runs), or an output that cannot be written |
| 130 | interrupted (Ctrl-C) |
| the program's | `run` exits with the status of the program it ran (1 for an uncaught exception) |

Errors are one line on stderr, starting `commdebug: error:`, naming the file and the problem;
an existing output file is left as it was (files are written to a temporary name and renamed).
`view FOLDER` still writes the page of the ranks it could read, prints its path, then one
error line per file it could not read, and exits 2. A folder whose dumps carry different
`metadata.run_id` is refused by every verb that reads folders, naming the odd files (dumps
without a run id are of unknown run: never a conflict). A closed pipe
(`commdebug table run.json | head`) ends quietly.
"""


class UsageError(CommDebugError):
    """A bad option value found after parsing (exit 2, like argparse's own usage errors)."""


def _checked(convert: Callable[[str], Any], ok: Callable[[Any], bool], rule: str, name: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` then ``ok``, else "must be <rule>, not '<value>'" (argparse
    would otherwise print the function's name: "invalid _noise value")."""

    def parse(value: str) -> Any:
        try:
            parsed = convert(value)
        except ValueError:
            parsed = None
        if parsed is None or not ok(parsed):
            raise argparse.ArgumentTypeError(f"must be {rule}, not {value!r}")
        return parsed

    parse.__name__ = name
    return parse


noise_level = _checked(int, lambda n: 0 <= n <= 3, "0, 1, 2 or 3", "noise level")
positive_int = _checked(int, lambda n: n >= 1, "a whole number >= 1", "number")
step_number = _checked(int, lambda n: n >= 0, "a whole number >= 0", "step")
seconds = _checked(float, lambda s: 0 < s < float("inf"), "a number of seconds > 0", "seconds")
port_number = _checked(int, lambda n: 1 <= n <= 65535, "a TCP port, 1-65535", "port")
percent = _checked(float, lambda p: 0 < p < float("inf"), "a percentage > 0", "percent")
top_count = _checked(int, lambda n: n >= 0, "a whole number >= 0", "count")


def _late_threshold(value: str) -> Any:
    from commdebug.analysis.late import LateThreshold  # torch-free, and only when the option is given

    return LateThreshold.parse(value)


late_threshold = _checked(_late_threshold, lambda t: True, "seconds, or seconds,percent (e.g. 0.05,10)", "late threshold")


def _version() -> str:
    # imported for --version only: importlib.metadata costs more than some verbs' whole work
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("commdebug")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``, the installed version looked up only when it is asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: Any = argparse.SUPPRESS,
                 help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        sys.stdout.write(f"commdebug {_version()}\n")
        parser.exit()


def _option(parser: argparse.ArgumentParser, *names: str, hidden: tuple[str, ...] = (), **kwargs: Any) -> None:
    """Add an option under its canonical ``names``, and its old spellings ``hidden`` as a second
    option writing the same attribute: they keep working but stay out of ``-h`` and docs/cli.md,
    so that one concept has one name on every verb.

    >>> _option(demo, "--noise-level", hidden=("--noise",), type=noise_level, default=0, help="...")  # doctest: +SKIP
    """
    action = parser.add_argument(*names, **kwargs)
    if hidden:
        # default=SUPPRESS: the alias must not overwrite the canonical option's default
        parser.add_argument(*hidden, **{**kwargs, "dest": action.dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS})


def _noise_level_option(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    _option(parser, "--noise-level", hidden=("--noise",), type=noise_level, default=default, metavar="N", help=help)


def _out_option(parser: argparse.ArgumentParser, default: str | None, help: str) -> None:
    _option(parser, "-o", "--out", hidden=("--output", "--out-dir"), default=default, metavar="OUT", help=help)


# one name per kind of input, in every verb: the metavar and the Namespace attribute
DUMP_HELP = "a JSON dump (ours or torch's CommDebugMode's)"
DUMPS_HELP = ("a JSON dump, or a folder of rank dumps (rank<N>.json) of one run; a folder whose subfolders hold them (one per "
              "node) and several folders named together are one job")

# verbs kept for old command lines, left out of -h and docs/cli.md: name -> the verb it is now
HIDDEN_VERBS = {"viewer": "view"}


class _Unbuilt:
    """In place of the parser of a verb the command line does not name: every call is ignored."""

    def __getattr__(self, name: str) -> Any:
        return self._ignore

    def _ignore(self, *args: Any, **kwargs: Any) -> _Unbuilt:
        return self


def _parser(verb_only: str | None = None) -> argparse.ArgumentParser:
    """The command line's grammar. ``verb_only``: the verb the command line names (one of
    ``VERBS``), the only one built: argparse makes a parser for each verb and a help formatter for
    each option, and all fifteen verbs' cost more than some verbs' whole work. The top-level
    ``-h`` and an unknown verb need them all (None)."""
    groupings = ""  # summary's --by choices, read where the verbs that take them are built
    if verb_only in (None, "summary", "estimate"):
        from commdebug.analysis.summary import BY

        groupings = ", ".join(BY)
    parser = argparse.ArgumentParser(prog="commdebug", description="See every collective a PyTorch distributed program issues.",
                                     epilog="Run `commdebug VERB -h` for a verb's options. Docs: docs/cli.md.")
    parser.add_argument("--version", action=_VersionAction)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        if verb_only not in (None, name):
            return cast(argparse.ArgumentParser, _Unbuilt())
        return verbs.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")

    demo = verb("demo", "trace a tensor-parallel transformer on a simulated world; print the table, write JSON and HTML")
    demo.add_argument("--world-size", type=positive_int, default=8, help="simulated ranks, >= 1 (default 8)")
    demo.add_argument("--layers", type=positive_int, default=4, help="transformer layers, >= 1 (default 4)")
    demo.add_argument("--steps", type=positive_int, default=2, help="training steps, >= 1 (default 2)")
    demo.add_argument("--checkpoint", action="store_true", help="activation-checkpoint every layer (default off)")
    _noise_level_option(demo, 0, "table noise level 0-3 (default 0)")
    _out_option(demo, "commdebug_demo", "folder for the files (default ./commdebug_demo)")

    view = verb("view", "write the HTML viewer of a JSON dump (ours or torch's CommDebugMode's) or of a folder of rank dumps; with neither, an empty viewer to drop any dump on")
    view.add_argument("dumps", nargs="*", metavar="DUMPS", help=DUMPS_HELP + " (default: none, an empty viewer; several folders: the page goes in the folder they share)")
    _view_options(view, "HTML file; {rank}/{world_size} allowed (default: the dump's name with .html; for a folder, FOLDER/index.html; with no DUMPS, commdebug_viewer.html)")
    view.add_argument("--cluster", default=None, help="for one dump, add predicted times on this preset or cluster JSON file (default: the dump's own metadata.cluster, if any)")
    _folder_options(view, steps="for a folder, the steps the heatmap and the per-op spread show, e.g. 10-12 (default all; the tree's numbers cover every step)")

    viewer = (verbs.add_parser("viewer", description="The same as `commdebug view` with no DUMPS: an empty viewer page.")
              if verb_only in (None, "viewer") else cast(argparse.ArgumentParser, _Unbuilt()))
    _view_options(viewer, "HTML file (default commdebug_viewer.html)")
    viewer.set_defaults(dumps=[], cluster=None)

    table = verb("table", "print the tracing table of a JSON dump")
    table.add_argument("dump", metavar="DUMP", help=DUMP_HELP)
    _noise_level_option(table, 0, "table noise level 0-3 (default 0)")
    table.add_argument("--cluster", default=None, help="at noise level 1-3, add each collective line's predicted time on this preset or cluster JSON file (default: the dump's own metadata.cluster, if any)")

    summary = verb("summary", "print the summary of a dump or of a folder of rank dumps: counts, bytes, latency and bandwidth by op, size, module, group, step or phase; for a folder, also each row's spread across ranks")
    summary.add_argument("dumps", nargs="+", metavar="DUMPS", help=DUMPS_HELP)
    summary.add_argument("--by", default="op", help=f"grouping, one of: {groupings}, peer (traffic by group, src, dst: all_to_all and send/recv) (default op)")
    summary.add_argument("--json", action="store_true", help="print rows as JSON with stable keys (default text)")
    summary.add_argument("--no-header", dest="header", action="store_false", help="leave out the header (host, times, notes): only the rows (default: with header)")
    summary.add_argument("--cluster", default=None, help="also predict each row's time on this preset or cluster JSON file (default: the dump's own metadata.cluster, if any)")
    summary.add_argument("--rank", type=step_number, default=None, metavar="R", help="with a folder, summarise rank R's dump (or stream) alone (default: every rank)")
    _quiet_option(summary)
    _jobs_option(summary)

    estimate = verb("estimate", "predict the communication time of a dump's collectives on a target cluster; on a timed run, measured beside predicted")
    estimate.add_argument("dumps", nargs="*", metavar="DUMPS", help="a JSON dump written by commdebug (fake process group plans too); a timed dump or folder of ranks (ours or Flight Recorder's with durations; a folder of per-node folders, or several folders) shows measured beside predicted")
    estimate.add_argument("--cluster", default=None, help="a preset (see --list) or a cluster JSON file (default: the dump's metadata.cluster)")
    estimate.add_argument("--by", default=None, help=f"grouping, one of: {groupings} (default op; a timed run is shown per op,bin, module and step, and --by adds a table)")
    estimate.add_argument("--ranks-per-node", type=positive_int, default=None, help="ranks per node, >= 1, nodes being consecutive blocks of ranks (default: the cluster's gpus_per_node)")
    estimate.add_argument("--json", action="store_true", help="print JSON (default text)")
    estimate.add_argument("--list", action="store_true", help="list the preset clusters with their figures and sources, and exit (default off)")

    calibrate = verb("calibrate", "fit a cluster's measured curves, latency and bandwidth from timed dumps and nccl-tests output and write a cluster JSON")
    calibrate.add_argument("files", nargs="+", metavar="INPUT", help="timed dumps (a folder of ranks or one dump, ours or Flight Recorder's with durations) and nccl-tests outputs (all_reduce_perf, ...), one run per file; several combine")
    _out_option(calibrate, "cluster.json", "cluster JSON file to write (default cluster.json)")
    calibrate.add_argument("--gpus-per-node", type=positive_int, default=None, help="GPUs per node, >= 1 (default: ranks per host in the files' '#  Rank' lines)")
    calibrate.add_argument("--base", default=None, help="preset or cluster file giving a link no file measured (default: none; then both links must be measured)")
    calibrate.add_argument("--name", default="calibrated", help="the cluster's name (default calibrated)")
    calibrate.add_argument("--statistic", choices=("median", "min", "p10"), default="median", help="one point from repeated calls at one size: their median (the typical call), minimum (the undisturbed one) or 10th percentile (near the undisturbed one, without the minimum's lone outliers) (default median)")

    run = verb("run", "run a Python program, unchanged, under CommDebugMode and write OUT/rank<R>.json however it ends")
    _out_option(run, "commdebug_traces", "folder for the per-rank dumps (default ./commdebug_traces)")
    _noise_level_option(run, 3, "noise level of what the dump keeps, 0-3 (default 3: everything)")
    run.add_argument("--timing", nargs="?", const="auto", default=None, choices=("auto", "events", "sync", "async"),
                     help="time each collective: events (CUDA events read once done, never waiting; on CPU the host clock from the call to its Work's completion, or to the program's own wait where there is no Work), sync (waits for each collective: serialises communication with compute, so the overlap you see is not the program's), async (NCCL's completion hook, opt-in); bare --timing (auto): sync for blocking CPU calls (async_op=False), which wait anyway; events for the rest, never waited for (default off)")
    run.add_argument("--start-step", type=step_number, default=None, help="first step to record, >= 0 (default: from the start)")
    run.add_argument("--end-step", type=step_number, default=None, help="step to stop recording at, exclusive (default: to the end)")
    run.add_argument("--hang-timeout", type=seconds, default=None, help="write the dump when a collective is stuck this many seconds, > 0 (default off)")
    run.add_argument("--keep-steps", type=positive_int, default=None, metavar="N",
                     help="keep raw events of the last N steps only, older ones as totals: bounded files for long runs (default: all events in the stream; docs/streaming.md)")
    run.add_argument("--no-stream", dest="stream", action="store_false", default=None,
                     help="do not stream OUT/rank<R>.jsonl while the program runs: only the dump at exit (default: stream)")
    run.add_argument("--metrics-port", type=port_number, default=None, metavar="P",
                     help="serve Prometheus metrics on port P + LOCAL_RANK at /metrics; at exit each rank writes its final ones to OUT/rank<R>.prom (default off; docs/metrics.md)")
    run.add_argument("--metrics-push", default=None, metavar="URL",
                     help="at exit, push each rank's final metrics to the Prometheus Pushgateway at URL (job commdebug, grouped by run_id and rank), waiting 5 s at most; the job's exit status is never changed (default off; docs/metrics.md)")
    run.add_argument("--debug-server", type=port_number, default=None, metavar="PORT",
                     help="start torch's debug server, its frontend on rank 0's PORT, with a /commdebug page of every rank's live state; trusted networks only (default off; docs/debug-server.md)")
    run.add_argument("--profile-steps", default=None, metavar="A-B",
                     help="run torch.profiler for commdebug steps A to B (both included; one step: A) on every rank and write OUT/rank<R>.profile.json.gz beside each dump, for `commdebug overlap` (default off; docs/overlap.md)")
    run.add_argument("--ops", default=None, help="comma-separated collectives to record only, e.g. all_reduce,all_gather (default all)")
    run.add_argument("--light", action="store_true",
                     help="light capture: record every collective without a dispatch mode, so only collectives cost; no DTensor ops or per-module op rows (default off: full capture; docs/capture.md)")
    run.add_argument("--detail-every", type=positive_int, default=None, metavar="N",
                     help="with light capture, record steps 0, N, 2N, ... in full detail; implies --light (default: no detail steps)")
    run.add_argument("-m", dest="module", action="store_true", help="the program is a module name (as python -m), not a script")
    run.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM", help="-- script.py ARGS... (or -m module ARGS...)")

    hook = verb("hook", "install or remove the start-up hook that records any program when COMMDEBUG=1")
    hook.add_argument("action", choices=("install", "uninstall", "status"), help="install, uninstall or status")
    hook.add_argument("--site-dir", default=None, help="site-packages folder (default: this environment's)")

    report = verb("report", "per-rank and per-op report of a folder of rank dumps (mpitrace-style min/median/max, stragglers)")
    report.add_argument("dumps", nargs="+", metavar="DUMPS", help=DUMPS_HELP)
    report.add_argument("--json", action="store_true", help="print JSON (default text)")
    report.add_argument("--top", type=top_count, default=None, metavar="K",
                        help="list only the K ranks furthest from the median (slowest or most deviant), 0 for all (default: all below 64 ranks, else 16; with --json, all)")
    report.add_argument("--late-threshold", type=late_threshold, default=None, metavar="S[,P]",
                        help="list a late rank where a rank waited for it at least S seconds and P%% of the step's median communication time (default 0.05,10)")
    _folder_options(report, steps="only these steps' calls, e.g. 10-12 (default all)")

    check = verb("check", "check that the ranks' collectives match (order, op, size, dtype, call sites, send/recv pairs) and name where ranks parted, at which step; exit 0 consistent, 1 not, 2 bad input")
    check.add_argument("dumps", nargs="+", metavar="DUMPS", help=DUMPS_HELP + "; PyTorch Flight Recorder dumps too")
    check.add_argument("--json", action="store_true", help="print JSON (default text)")
    _quiet_option(check)
    _jobs_option(check)

    diff = verb("diff", "compare two dumps (or folders) per module, phase and op; exit 0 same, 1 different, 2 bad input")
    diff.add_argument("before", metavar="BEFORE", help="the reference: " + DUMPS_HELP)
    diff.add_argument("after", metavar="AFTER", help="the run to compare, the same kind as BEFORE")
    diff.add_argument("--json", action="store_true", help="print JSON (default text)")
    diff.add_argument("--ignore-groups", action="store_true",
                      help="compare without process groups, for a dump written by torch's own CommDebugMode, which has none (default: compare groups too)")
    _quiet_option(diff)

    watch = verb("watch", "live view of a running job from its folder: each rank's step, communication, last collective; stalled, straggling, failed and gone ranks; exits when every rank has ended: 0 healthy, 1 not, 2 bad input")
    watch.add_argument("dumps", nargs="+", metavar="DUMPS", help="the folder of rank dumps a running job streams into (commdebug run --out); a shared file system is enough; per-node folders: their parent, or each of them")
    watch.add_argument("--once", action="store_true", help="print one frame and exit with the verdict (default: refresh until every rank of the run has ended, by a final dump or a process gone, then exit with the verdict)")
    watch.add_argument("--follow", action="store_true", help="keep refreshing after every rank has ended, until Ctrl-C, for a job relaunched into the same folder (default: exit once every rank has ended)")
    watch.add_argument("--interval", type=seconds, default=2.0, metavar="S", help="seconds between frames (default 2)")
    watch.add_argument("--stall-after", type=seconds, default=60.0, metavar="S", help="a rank with no progress this long while others wait in a collective is stalled (default 60)")
    watch.add_argument("--behind-pct", type=percent, default=10.0, metavar="X", help="a rank more than X%% behind the median step (and at least a step) is a straggler (default 10)")
    watch.add_argument("--json", action="store_true", help="print the frame as JSON (default text)")

    overlap = verb("overlap", "how much of each rank's communication ran under compute and how much was exposed, from torch.profiler traces or profiled steps (commdebug run --profile-steps), by op, step, group, module, phase or line")
    overlap.add_argument("dumps", nargs="+", metavar="DUMPS", help="a torch.profiler trace (.json, .json.gz, .pt.trace.json), a folder of one trace per rank, or a folder a `commdebug run --profile-steps` wrote (dumps with their profiles); per-node folders: their parent, or each of them")
    overlap.add_argument("--by", default="op", help="rows by one of: op, step, group, module, phase, line, unit (module: the module that issued the call; unit: the FSDP unit whose parameters it moved; module, line and unit need the profiles joined to commdebug dumps) (default op)")
    overlap.add_argument("--json", action="store_true", help="print JSON (default text)")
    overlap.add_argument("--round-us", action="store_true", help="round activity times inward to whole microseconds, as HolisticTraceAnalysis 0.5.0 does, to reproduce its figure (default: the trace's own times)")
    _quiet_option(overlap)
    _jobs_option(overlap)

    trace = verb("trace", "write a Chrome trace (Perfetto, chrome://tracing) of a dump or a folder of rank dumps")
    trace.add_argument("dumps", nargs="+", metavar="DUMPS", help=DUMPS_HELP)
    _out_option(trace, "commdebug_trace.json", "trace file (default commdebug_trace.json)")
    trace.add_argument("--cluster", default=None, help="add a track of predicted times per rank on this preset or cluster JSON file (default: each dump's own metadata.cluster, if any)")
    _folder_options(trace, steps="only these steps' calls, e.g. 10-12 (default all)")
    trace.add_argument("--no-flows", dest="flows", action="store_false", help="leave out the flow arrows joining the ranks' calls of one collective (default: with flows)")
    return parser


def _quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr while reading a folder (default: one, when stderr is a terminal)")


def _folder_options(parser: argparse.ArgumentParser, steps: str) -> None:
    parser.add_argument("--ranks", default=None, metavar="LIST", help="only these ranks, e.g. 0-7,512 (default all)")
    parser.add_argument("--steps", default=None, metavar="LIST", help=steps)
    _quiet_option(parser)
    _jobs_option(parser)


def _jobs_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-j", "--jobs", type=positive_int, default=None, metavar="N",
                        help="processes parsing a folder's dumps, >= 1; the output is the same for any N (default: one per CPU, at most 8, for folders over 32 MiB; else 1)")






def _view_options(parser: argparse.ArgumentParser, out_help: str) -> None:
    _out_option(parser, None, out_help)
    parser.add_argument("--open", action="store_true", help="open it in the browser (default off)")
