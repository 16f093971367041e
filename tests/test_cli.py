"""The `commdebug` command: real subprocesses, real files, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # this checkout's commdebug, from any working directory
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd or ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def in_process(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    """(exit status, stdout) of ``commdebug ARGS`` run in this process, for verbs that set up no
    process group: an interpreter per call costs seconds."""
    from commdebug.cli import main

    status = main(list(args))
    return status, capsys.readouterr().out


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> subprocess.CompletedProcess:
    out = tmp_path_factory.mktemp("demo")
    proc = cli("demo", "--layers", "2", "--steps", "2", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    proc.out_dir = out  # type: ignore[attr-defined]
    return proc


@pytest.fixture(scope="module")
def demo_dir(demo) -> Path:
    return demo.out_dir


@pytest.mark.proc
def test_demo_prints_the_table_and_writes_files(demo, demo_dir):
    stdout = demo.stdout
    assert stdout.startswith("Global\n  FORWARD PASS\n")
    assert "Transformer.layers.1.feed_forward.w2" in stdout
    assert "step 2/2" in demo.stderr
    dump = json.loads((demo_dir / "comm_mode_log.json").read_text())
    meta = dump["commdebug"]["metadata"]
    assert meta["world_size"] == 8 and meta["steps"] == 2 and meta["backend"] == "fake"
    total = dump["commdebug"]["summary"]["collectives"]
    assert f"{total} collectives" in stdout
    assert (demo_dir / "comm_mode_log.txt").read_text().startswith("Global\n")
    assert "<html" in (demo_dir / "comm_mode_log.html").read_text()


@pytest.mark.proc
def test_view_writes_html_next_to_the_dump(demo_dir, tmp_path):
    dump = tmp_path / "run.json"
    dump.write_text((demo_dir / "comm_mode_log.json").read_text())
    proc = cli("view", str(dump))
    assert proc.returncode == 0, proc.stderr
    html = tmp_path / "run.html"
    assert proc.stdout.strip() == str(html)
    assert html.stat().st_size > 10_000
    custom = tmp_path / "sub" / "page.html"
    assert cli("view", str(dump), "-o", str(custom)).returncode == 0 and custom.exists()


@pytest.mark.proc
def test_view_refuses_to_overwrite_the_dump(demo_dir, tmp_path):
    dump = tmp_path / "run.json"
    dump.write_text((demo_dir / "comm_mode_log.json").read_text())
    proc = cli("view", str(dump), "-o", str(dump))
    assert proc.returncode == 2 and "would overwrite the dump" in proc.stderr
    assert dump.read_text().startswith("{")


@pytest.mark.proc
def test_table_of_a_dump(demo_dir):
    proc = cli("table", str(demo_dir / "comm_mode_log.json"), "--noise-level", "1")
    assert proc.returncode == 0
    assert "*module type: class 'torch.nn.modules.linear.Linear'" in proc.stdout


@pytest.mark.proc
def test_view_without_a_dump_writes_an_empty_viewer(tmp_path):
    out = tmp_path / "viewer.html"
    proc = cli("view", "-o", str(out))
    assert (proc.returncode, proc.stdout) == (0, f"{out}\n") and "<html" in out.read_text()
    assert cli("view", cwd=tmp_path).stdout == "commdebug_viewer.html\n" and (tmp_path / "commdebug_viewer.html").exists()
    proc = cli("view", "--cluster", "h100-ib400", "-o", str(tmp_path / "never.html"))
    assert (proc.returncode, proc.stderr) == (2, "commdebug: error: --cluster needs a dump: commdebug view DUMP --cluster NAME|FILE\n")


@pytest.mark.proc
@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), ("{oops", "not valid JSON"), ('{"a": 1}', "not a CommDebugMode dump"), ('{"fqn": "Global", "children": [], "commdebug": {"schema_version": 99}}', "schema version 99")],
)
def test_view_bad_input_one_line_nonzero_and_keeps_old_html(tmp_path, content, message):
    dump = tmp_path / "bad.json"
    if content is not None:
        dump.write_text(content)
    old = tmp_path / "bad.html"
    old.write_text("earlier page")
    proc = cli("view", str(dump))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commdebug: error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr
    assert old.read_text() == "earlier page"


@pytest.mark.proc
def test_usage_errors_exit_2():
    assert cli("table", "x.json", "--noise-level", "9").returncode == 2
    assert cli("nonsense").returncode == 2


@pytest.mark.proc
def test_demo_bad_world_size_is_one_line():
    proc = cli("demo", "--world-size", "3", "--layers", "1", "--steps", "1", "-o", "/tmp/commdebug-never")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("commdebug: error: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.proc
def test_version_and_help_say_defaults_and_ranges():
    from importlib.metadata import version

    proc = cli("--version")
    assert (proc.returncode, proc.stdout) == (0, f"commdebug {version('commdebug')}\n")
    top = cli("-h").stdout
    import argparse

    from commdebug.cli import HIDDEN_VERBS, VERBS, _parser

    verbs = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(verbs.choices) == set(VERBS)
    for verb, sub in verbs.choices.items():
        assert (f"    {verb}" in top) != (verb in HIDDEN_VERBS), verb
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:  # old spellings
                continue
            assert action.help, (verb, action.dest)
            if action.option_strings:  # every option says its default (and range where it has one)
                assert "default" in action.help or action.dest == "module", (verb, action.dest)


def test_each_verb_built_alone_is_the_whole_grammars():
    """A command line builds the parser of the verb it names alone (start-up time): that
    parser is the whole grammar's."""
    import argparse

    from commdebug.cli import VERBS, _parser

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    whole = subparsers(_parser())
    for verb in VERBS:
        alone = subparsers(_parser(verb))
        assert list(alone) == [verb]
        assert alone[verb].format_help() == whole[verb].format_help(), verb
        assert [(a.option_strings, a.dest, a.default, a.nargs, a.required, a.choices) for a in alone[verb]._actions] == \
               [(a.option_strings, a.dest, a.default, a.nargs, a.required, a.choices) for a in whole[verb]._actions], verb


@pytest.mark.proc
def test_overlap_of_a_trace_loads_only_what_it_uses():
    """`overlap --json TRACE` is timed against HolisticTraceAnalysis as a whole process
    (bench/overlap_vs_hta.py): no torch, no package metadata (--version alone reads it), no JSON
    library the C reader does not need, no other verb's analysis, no text renderer."""
    trace = ROOT / "tests" / "data" / "kineto" / "nccl_data.json.gz"
    unused = ("torch", "importlib.metadata", "orjson", "webbrowser", "statistics", "commdebug.analysis.summary",
              "commdebug.render.overlap")
    code = ("import sys, commdebug.cli as c; rc = c.main(sys.argv[1:]); "
            f"print('LOADED', sorted(m for m in {unused!r} if m in sys.modules), file=sys.stderr); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "overlap", "--json", str(trace)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["ranks"][0]["rank"] == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "LOADED []", proc.stderr


@pytest.mark.proc
def test_bad_values_never_show_internal_names():
    proc = cli("table", "x.json", "--noise-level", "loud")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == "commdebug table: error: argument --noise-level: must be 0, 1, 2 or 3, not 'loud'"
    assert "_noise" not in proc.stderr and "invalid" not in proc.stderr
    assert "must be a number of seconds > 0, not '0'" in cli("run", "--hang-timeout", "0", "--", "x.py").stderr


@pytest.mark.proc
def test_demo_checks_its_folder_before_working(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    proc = cli("demo", "--layers", "1", "--steps", "1", "-o", str(a_file))
    assert proc.returncode == 2 and proc.stderr == f"commdebug: error: {a_file}: exists and is not a folder (the output folder must be a folder)\n"
    assert a_file.read_text() == "mine"
    assert cli("demo", "-o", "").stderr == "commdebug: error: the output folder is empty; give a folder name\n"


@pytest.mark.proc
def test_empty_or_folder_output_names_are_plain_errors(demo_dir, tmp_path):
    dump = str(demo_dir / "comm_mode_log.json")
    assert cli("view", dump, "-o", "").stderr == "commdebug: error: the HTML file name is empty; give a file name\n"
    assert cli("view", dump, "-o", str(tmp_path)).stderr == f"commdebug: error: {tmp_path}: is a folder; the HTML file must be a file name\n"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = cli("trace", dump, "-o", str(blocker / "t.json"))
    assert proc.returncode == 2 and proc.stderr == f"commdebug: error: {blocker}: is a file, so {blocker / 't.json'} cannot be written\n"


@pytest.mark.proc
def test_closed_pipe_ends_quietly(demo_dir):
    shell = f"{sys.executable} -m commdebug table {demo_dir / 'comm_mode_log.json'} --noise-level 3 | head -n 1"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout.count("\n") == 1
    assert proc.stderr == "" and proc.returncode == 0


@pytest.mark.proc
def test_summary_of_a_dump_and_its_errors(demo_dir):
    dump = str(demo_dir / "comm_mode_log.json")
    proc = cli("summary", dump, "--by", "module")
    assert proc.returncode == 0 and "no timing was recorded" in proc.stdout
    rows = json.loads(cli("summary", dump, "--json").stdout)["rows"]
    total = json.loads((demo_dir / "comm_mode_log.json").read_text())["commdebug"]["events"]["count"]
    assert sum(r["calls"] for r in rows) == total
    assert cli("summary", dump, "--by", "colour").stderr.startswith("commdebug: error: unknown summary grouping 'colour'")
    assert cli("summary", str(demo_dir)).stderr == f"commdebug: error: {demo_dir}: no rank dumps in this folder (expected rank<N>.json, Flight Recorder files or torch.profiler traces)\n"


@pytest.mark.proc
def test_cli_reference_page_is_generated_from_the_parser():
    proc = subprocess.run([sys.executable, "scripts/gen_cli_docs.py", "--check"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from commdebug.cli import HIDDEN_VERBS, VERBS

    page = (ROOT / "docs" / "cli.md").read_text()
    assert all((f"## commdebug {verb}\n" in page) != (verb in HIDDEN_VERBS) for verb in VERBS)


@pytest.mark.proc
def test_run_keeps_the_programs_exit_status_and_argv(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint(sys.argv[1:], __name__)\nsys.exit(int(sys.argv[1]))\n")
    proc = cli("run", "--out", str(tmp_path / "t"), "--", str(script), "3", "--lr", "1e-3")
    assert (proc.returncode, proc.stdout) == (3, "['3', '--lr', '1e-3'] __main__\n")
    assert not (tmp_path / "t" / "rank0.json").exists()  # no process group: nothing to record
    data = tmp_path / "x.json"
    data.write_text('{"a": 1}')
    module = cli("run", "--out", str(tmp_path / "t"), "-m", "json.tool", str(data))  # closes stdout itself
    assert module.returncode == 0 and module.stderr.startswith("commdebug: recorded nothing: ")
    assert len(module.stderr.splitlines()) == 1
    missing = cli("run", "--", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and missing.stderr == f"commdebug: error: {tmp_path / 'nope.py'}: no such script (use -m NAME to run a module)\n"


@pytest.mark.parametrize("flags, expected", [
    ([], {}),
    (["--light"], {"light": True}),
    (["--detail-every", "10"], {"light": True, "detail_every": 10}),  # implies --light
    (["--light", "--detail-every", "3", "--timing"], {"light": True, "detail_every": 3, "timing": "auto"}),
    (["--light", "--timing", "events"], {"light": True, "timing": "events"}),
])
def test_run_light_flags_reach_the_options(monkeypatch, flags, expected):
    from commdebug import cli as cli_module
    from commdebug.capture.config import Options
    from commdebug.launch import run

    seen = {}
    monkeypatch.setattr(run, "run_program", lambda target, module, out, **kw: seen.update(target=target, **kw) or 0)
    assert cli_module.main(["run", *flags, "--", "train.py", "--lr", "1"]) == 0
    assert seen.pop("target") == ["train.py", "--lr", "1"]
    options = {k: v for k, v in seen.items() if k not in ("hang_timeout", "noise_level")}
    assert options == expected
    resolved = Options.resolve(options, env={})  # what the recorder of each rank is made with
    assert (resolved.light, resolved.detail_every) == (bool(expected), expected.get("detail_every"))


@pytest.mark.proc
@pytest.mark.parametrize("value", ["0", "-1", "ten", ""])
def test_run_bad_detail_every_is_a_usage_error(value):
    proc = cli("run", "--detail-every", value, "--", "x.py")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == f"commdebug run: error: argument --detail-every: must be a whole number >= 1, not {value!r}"


def test_table_and_summary_say_where_a_light_capture_has_detail(tmp_path, capsys):
    from commdebug import cli as cli_module

    from synthetic import transformer_dump, write_rank_dumps

    small = {"layers": 1, "steps": 3, "dim": 64, "ffn": 256, "vocab": 256, "tokens": 32}
    full, light = tmp_path / "full.json", tmp_path / "light.json"
    full.write_text(json.dumps(transformer_dump(**small)))
    dump = transformer_dump(**small)
    dump["commdebug"]["metadata"].update(capture="light", detail_every=2, detail_steps=[0, 2])
    light.write_text(json.dumps(dump))
    note = "light capture: operation rows and DTensor ops only on detail steps 0, 2 (detail_every=2)"

    def out(*argv: str) -> str:
        assert cli_module.main(list(argv)) == 0
        return capsys.readouterr().out

    for level in "0123":
        assert out("table", str(full), "--noise-level", level).startswith("Global\n")  # full: as before
        lines = out("table", str(light), "--noise-level", level).splitlines()
        assert lines[:2] == (["Global", "  FORWARD PASS"] if level == "0" else [note, "Global"])
    assert note in out("summary", str(light)).splitlines()[:4]
    assert "light capture" not in out("summary", str(full))
    header = json.loads(out("summary", str(light), "--json"))["header"]
    assert (header["capture"], header["detail_every"], header["detail_steps"]) == ("light", 2, [0, 2])
    assert "capture" not in json.loads(out("summary", str(full), "--json"))["header"]

    folder = tmp_path / "job"
    for path in write_rank_dumps(folder, ranks=2, **small):
        data = json.loads(path.read_text())
        steps = [0, 2] if path.name == "rank0.json" else [0]  # rank 1 stopped early
        data["commdebug"]["metadata"].update(capture="light", detail_every=2, detail_steps=steps)
        path.write_text(json.dumps(data))
    assert note in out("summary", str(folder)).splitlines()[:4]
    # a hand-edited dump: odd values are left out, never a traceback
    dump["commdebug"]["metadata"].update(detail_every=[2], detail_steps="0,2")
    light.write_text(json.dumps(dump))
    assert "light capture: no operation rows or DTensor ops (no detail steps)" in out("summary", str(light))

# ---------------------------------------------------------------- exit status 2 on every bad input

@pytest.fixture
def bad_inputs(tmp_path) -> dict[str, Path]:
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{oops")
    schema = tmp_path / "schema.json"
    schema.write_text('{"fqn": "Global", "children": [], "commdebug": {"schema_version": 99}}')
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "rank0.json").write_text("{oops")
    return {"missing": tmp_path / "nowhere.json", "corrupt": corrupt, "schema": schema, "folder": folder,
            "missing_folder": tmp_path / "nowhere"}


@pytest.mark.parametrize("verb", ["view", "table", "summary", "estimate", "report", "check", "trace", "diff"])
def test_bad_input_exits_2_in_every_verb(bad_inputs, tmp_path, capsys, verb):
    from commdebug.cli import main  # in this process: 30 cases, no torch start-up each

    for kind, path in bad_inputs.items():
        if kind in ("folder", "missing_folder") and verb in ("table", "estimate"):
            continue  # these read one dump only
        p = str(path)
        args = {"diff": (p, p), "trace": (p, "-o", str(tmp_path / "t.json")),
                "view": (p, "-o", str(tmp_path / "v.html")), "estimate": (p, "--cluster", "h100-ib400")}.get(verb, (p,))
        status = main([verb, *args])
        err = capsys.readouterr().err
        assert status == 2, (verb, kind, err)
        assert err.startswith("commdebug: error: ") and err.count("\n") == 1, (verb, kind, err)


def test_each_bad_input_reads_the_same_in_every_verb(tmp_path, capsys):
    """A missing path, a zero-byte file, a folder with no dumps and a folder whose one rank file
    is empty: one line on stderr, exit 2, and the same sentence whichever verb read it."""
    from commdebug.cli import main  # in this process: no interpreter start-up per case

    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    no_dumps = tmp_path / "no_dumps"
    no_dumps.mkdir()
    (no_dumps / "notes.txt").write_text("not a dump")
    empty_rank = tmp_path / "empty_rank"
    empty_rank.mkdir()
    (empty_rank / "rank0.json").write_bytes(b"")
    said = {tmp_path / "nowhere": f"{tmp_path / 'nowhere'}: no such file or folder",
            empty: f"{empty}: empty file (0 bytes)",
            no_dumps: f"{no_dumps}: no rank dumps in this folder (expected rank<N>.json, Flight Recorder files or torch.profiler traces)",
            empty_rank: f"{empty_rank / 'rank0.json'}: empty file (0 bytes)"}
    verbs = [["view", "-o", str(tmp_path / "v.html")], ["table"], ["summary"], ["summary", "--by", "peer"], ["report"], ["check"],
             ["trace", "-o", str(tmp_path / "t.json")], ["estimate", "--cluster", "h100-ib400"],
             ["calibrate", "-o", str(tmp_path / "c.json")], ["watch", "--once"], ["watch", "--json"], ["diff"]]
    for path, sentence in said.items():
        for verb, *options in verbs:
            if verb == "table" and path == empty_rank:
                continue  # a folder with a rank in it: table says it reads one dump (test above)
            args = [verb, str(path), *options] + ([str(path)] if verb == "diff" else [])
            status = main(args)
            err = capsys.readouterr().err
            assert (status, err) == (2, f"commdebug: error: {sentence}\n"), args
    assert not any((tmp_path / name).exists() for name in ("v.html", "t.json", "c.json"))


@pytest.mark.proc
def test_diff_of_a_missing_path_says_it_does_not_exist(demo_dir, tmp_path):
    for a, b in ((tmp_path / "nonexistent", demo_dir), (demo_dir, tmp_path / "nonexistent")):
        proc = cli("diff", str(a), str(b))
        missing = a if not a.exists() else b
        assert (proc.returncode, proc.stderr) == (2, f"commdebug: error: {missing}: no such file or folder\n")


@pytest.mark.proc
def test_view_of_a_folder_with_an_unreadable_rank_says_so_and_exits_2(tmp_path):
    from synthetic import write_rank_dumps

    write_rank_dumps(tmp_path, ranks=2, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    (tmp_path / "rank2.json").write_text("{oops")
    (tmp_path / "rank3.json").write_text('{"fqn": "Global", "children": [], "commdebug": {"schema_version": 99}}')
    proc = cli("view", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stdout == f"{tmp_path / 'index.html'}\n"  # the readable ranks' page is still written
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("commdebug: error: ") for line in lines)
    assert f"{tmp_path / 'rank2.json'}: not valid JSON" in lines[0] and f"{tmp_path / 'rank3.json'}: dump schema version 99" in lines[1]
    assert "not read: " in (tmp_path / "index.html").read_text()


# ---------------------------------------------------------------- one vocabulary; old spellings

OLD = re.compile(r"--output\b|--out-dir\b|--noise\b(?!-)")


@pytest.mark.proc
def test_old_spellings_still_work(demo_dir, tmp_path, capsys, monkeypatch):
    from commdebug.cli import main

    def run(*args: str) -> tuple[int, str]:
        return in_process(capsys, *args)

    dump = str(demo_dir / "comm_mode_log.json")
    assert run("table", dump, "--noise", "1") == run("table", dump, "--noise-level", "1")
    assert run("view", dump, "--output", str(tmp_path / "a.html"))[0] == 0 and (tmp_path / "a.html").exists()
    assert run("trace", dump, "--output", str(tmp_path / "t.json"))[0] == 0 and (tmp_path / "t.json").exists()
    assert run("viewer", "--output", str(tmp_path / "empty.html"))[0] == 0 and "<html" in (tmp_path / "empty.html").read_text()
    monkeypatch.chdir(tmp_path)
    assert run("viewer") == (0, "commdebug_viewer.html\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--noise", "9", "--", "x.py"])
    assert exit_info.value.code == 2 and "argument --noise: must be 0, 1, 2 or 3, not '9'" in capsys.readouterr().err
    # the demo sets up a process group: a process of its own
    proc = cli("demo", "--layers", "1", "--steps", "1", "--out-dir", str(tmp_path / "d"), "--noise", "1")
    assert proc.returncode == 0 and (tmp_path / "d" / "comm_mode_log.json").exists()
    assert "*module type: class" in proc.stdout  # noise level 1 reached the table


def test_namespace_is_the_same_whichever_spelling(tmp_path):
    from commdebug.cli import _parser

    parse = _parser().parse_args
    assert parse(["run", "--noise", "1", "--output", "t", "--", "x.py"]).__dict__ == parse(["run", "--noise-level", "1", "-o", "t", "--", "x.py"]).__dict__
    assert parse(["demo", "--out-dir", "d"]).out == parse(["demo", "--out", "d"]).out == "d"
    assert parse(["run", "--", "x.py"]).noise_level == 3 and parse(["demo"]).out == "commdebug_demo"  # aliases keep the defaults
    viewer, view = parse(["viewer", "-o", "v.html"]), parse(["view", "-o", "v.html"])
    assert (viewer.dumps, viewer.out, viewer.cluster) == (view.dumps, view.out, view.cluster) == ([], "v.html", None)
    diff = parse(["diff", "a.json", "b.json"])
    assert (diff.before, diff.after) == ("a.json", "b.json")


def test_old_spellings_are_hidden_from_help_and_docs():
    import argparse

    from commdebug.cli import _parser

    # the text `-h` prints (argparse's print_help writes format_help), without a process per verb
    parser = _parser()
    assert not re.search(r"^ +viewer\b", parser.format_help(), flags=re.M)
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for verb in ("demo", "view", "table", "calibrate", "run", "trace"):
        text = verbs.choices[verb].format_help()
        assert not OLD.search(text), (verb, OLD.search(text))
        assert set(verbs.choices[verb]._option_string_actions) & {"--output", "--out-dir", "--noise"}, verb  # there, only hidden
    reference = [line for line in (ROOT / "docs" / "cli.md").read_text().splitlines() if line.startswith(("| `", "commdebug "))]
    assert reference and not any(OLD.search(line) for line in reference)
    assert not any("viewer`" in line or line.startswith("commdebug viewer") for line in reference)


def test_every_output_is_dash_o_and_every_input_has_one_name():
    import argparse

    from commdebug.cli import _parser

    verbs = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for verb, sub in verbs.choices.items():
        for action in sub._actions:
            if action.dest == "out":
                assert {"-o", "--out"} <= set(action.option_strings) or action.help == argparse.SUPPRESS, verb
            if not action.option_strings and action.dest not in ("program", "action"):
                assert (action.dest, action.metavar) in {("dump", "DUMP"), ("dumps", "DUMPS"), ("before", "BEFORE"), ("after", "AFTER"),
                                                         ("files", "INPUT")}, (verb, action.dest, action.metavar)


# ---------------------------------------------------------------- summary of a folder, --no-header, latency min/max

@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    from synthetic import write_rank_dumps

    folder = tmp_path_factory.mktemp("job")
    write_rank_dumps(folder, ranks=3, layers=2, steps=2, dim=64, ffn=256, vocab=256, tokens=32)
    return folder


@pytest.mark.proc
def test_summary_of_a_folder_adds_up_the_ranks_and_says_how_they_spread(job):
    import commdebug
    from commdebug.analysis.summary import summarize

    ranks = [summarize(commdebug.load(job / f"rank{r}.json"), "op") for r in range(3)]
    data = json.loads(cli("summary", str(job), "--json").stdout)
    assert data["header"]["ranks"] == [0, 1, 2] and data["header"]["collectives"] == sum(s.header["collectives"] for s in ranks)
    by_op = {r["op"]: r for r in data["rows"]}
    for op, row in by_op.items():
        mine = [next(x for x in s.rows if x.key["op"] == op) for s in ranks]
        assert row["calls"] == sum(m.calls for m in mine)
        assert row["time_s"] == pytest.approx(sum(m.time_s for m in mine))
        assert row["latency_min_s"] == min(m.latency_min_s for m in mine) and row["latency_max_s"] == max(m.latency_max_s for m in mine)
        spread = row["per_rank"]
        assert (spread["calls"]["min"], spread["calls"]["max"]) == (min(m.calls for m in mine), max(m.calls for m in mine))
        assert spread["time_s"]["median"] == pytest.approx(sorted(m.time_s for m in mine)[1])
        assert spread["slowest_rank"] == spread["time_s"]["max_rank"] == 2  # rank r is 1 + r/50 times slower
    text = cli("summary", str(job)).stdout
    assert text.startswith("commdebug summary by op: ranks 0-2 of 3 on synthetic-node0, 2 steps, ")
    assert "per rank, over 3 ranks: min / median / max; slowest: the rank with the most time in the row" in text
    assert re.search(r"^all_reduce +\d+ +\d+ +\d+ +[\d.]+ [mun]?s +[\d.]+ [mun]?s +[\d.]+ [mun]?s +r2$", text, flags=re.M), text


@pytest.mark.proc
def test_summary_of_a_folder_percentiles_are_those_of_every_call(job):
    import statistics

    import commdebug
    from commdebug.analysis.summary import summarize_path

    calls = [e for r in range(3) for e in commdebug.load(job / f"rank{r}.json").events if e.op == "all_reduce"]
    row = next(r for r in summarize_path(job, "op").rows if r.key["op"] == "all_reduce")
    exact = statistics.quantiles([e.busbw_gbps for e in calls], n=100, method="inclusive")
    for got, want in ((row.busbw_p50_gbps, exact[49]), (row.busbw_p90_gbps, exact[89]), (row.busbw_p99_gbps, exact[98])):
        assert got == pytest.approx(want, rel=0.003)  # bins 0.27% wide


@pytest.mark.proc
def test_summary_of_a_folder_where_ranks_differ_names_them(tmp_path):
    from synthetic import write_rank_dumps

    write_rank_dumps(tmp_path, ranks=2, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32)
    data = json.loads((tmp_path / "rank1.json").read_text())
    columns = data["commdebug"]["events"]["columns"]
    keep = [i for i, t in enumerate(columns["latency_s"]) if i != 0]  # rank 1 lost its first call
    for name, values in columns.items():
        columns[name] = [values[i] for i in keep]
    data["commdebug"]["events"]["count"] = len(keep)
    (tmp_path / "rank1.json").write_text(json.dumps(data))
    first_op = json.loads((tmp_path / "rank0.json").read_text())["commdebug"]["events"]
    op = first_op["strings"][first_op["columns"]["op"][0]]
    row = next(r for r in json.loads(cli("summary", str(tmp_path), "--json").stdout)["rows"] if r["op"] == op)
    assert (row["per_rank"]["calls"]["min"], row["per_rank"]["calls"]["min_rank"], row["per_rank"]["calls"]["max_rank"]) == (row["per_rank"]["calls"]["max"] - 1, 1, 0)
    assert re.search(rf"^{op} +\d+ \(r1\) +[\d.]+ +\d+ \(r0\)", cli("summary", str(tmp_path)).stdout, flags=re.M)


@pytest.mark.proc
def test_summary_refuses_a_folder_mixing_runs(job, tmp_path):
    import shutil

    for r, run_id in ((0, "run-a"), (1, "run-b")):
        data = json.loads((job / f"rank{r}.json").read_text())
        data["commdebug"]["metadata"]["run_id"] = run_id
        (tmp_path / f"rank{r}.json").write_text(json.dumps(data))
    shutil.copy(job / "rank2.json", tmp_path / "rank2.json")
    proc = cli("summary", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("commdebug: error: ") and proc.stderr.count("\n") == 1 and "run" in proc.stderr


@pytest.mark.proc
def test_summary_without_header(job, capsys):
    dump = str(job / "rank0.json")
    for path in (dump, str(job)):
        full, bare = in_process(capsys, "summary", path)[1], in_process(capsys, "summary", path, "--no-header")[1]
        assert bare.startswith("op ") and "synthetic-node" not in bare and "commdebug summary" not in bare
        assert full.endswith(bare)  # the same rows, only the header left out
        data = json.loads(in_process(capsys, "summary", path, "--json", "--no-header")[1])
        assert "header" not in data and data["rows"]


@pytest.mark.proc
def test_summary_latency_min_and_max(job):
    import commdebug
    from commdebug.analysis.summary import summarize
    from commdebug.render.summary import render_summary, summary_dict
    from commdebug.units import format_duration

    trace = commdebug.load(job / "rank1.json")
    summary = summarize(trace, "op,bin")
    text = render_summary(summary, header=False)
    titles = text.splitlines()[0].split()
    assert titles[titles.index("avg"):titles.index("avg") + 3] == ["avg", "min", "max"]
    rows = summary_dict(summary)["rows"]
    for row in rows:
        latencies = [e.latency_s for e in trace.events if e.op == row["op"] and row["size_bin"][0] <= e.size_bytes < max(row["size_bin"][1], 1)]
        assert (row["latency_min_s"], row["latency_max_s"]) == (min(latencies), max(latencies)), row
        assert row["size_bin_label"] in text and isinstance(row["size_bin"], list)
        line = next(s for s in text.splitlines() if s.startswith(row["op"]) and row["size_bin_label"] in s)
        assert f"  {format_duration(min(latencies))}  " in line and f"  {format_duration(max(latencies))}  " in line
