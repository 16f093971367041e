"""Real torchrun jobs on gloo, recorded without changing the program: `commdebug run` and the
COMMDEBUG=1 start-up hook; per-rank dumps however a rank ends (normal exit, an exception,
SIGTERM, a hang); then `check`, `report`, `diff`, `trace` and `summary` on what they wrote,
and `check` on PyTorch Flight Recorder dumps of the same job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commdebug.launch import hook

from chrome_trace_rules import validate_chrome_trace

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "programs" / "job.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
DEADLINE_S = 120
# the line of the all_reduce that JOB_BAD=skip leaves out on one rank
SKIPPED_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "dist.all_reduce(grad)" in line)
BROADCAST_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "dist.broadcast(" in line)


def torchrun(nproc: int, *args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([*TORCHRUN, f"--nproc-per-node={nproc}", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=DEADLINE_S)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # this checkout's commdebug, from any working directory
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd or ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def dumps(folder: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text())["commdebug"] for p in sorted(folder.glob("rank*.json"))}


@pytest.fixture(scope="module")
def consistent(tmp_path_factory) -> Path:
    """4 ranks, `commdebug run --timing`, a program that does everything right."""
    cwd = tmp_path_factory.mktemp("consistent")
    proc = torchrun(4, "-m", "commdebug", "run", "--out", "traces", "--timing", "--", str(JOB), cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd / "traces"


@pytest.mark.timeout(DEADLINE_S + 30)
def test_run_writes_every_rank_and_the_page(consistent):
    got = dumps(consistent)
    assert sorted(got) == [0, 1, 2, 3]
    assert (consistent / "rank0.html").is_file() and not (consistent / "rank1.html").exists()
    for rank, section in got.items():
        meta = section["metadata"]
        assert (meta["rank"], meta["world_size"], meta["backend"], meta["ended_by"]) == (rank, 4, "gloo", "exit")
        ops = section["events"]["columns"]["op"]
        names = [section["events"]["strings"][i] for i in ops]
        # 2 steps x (grad all_reduce, broadcast, pair all_reduce, send or recv) + barrier
        assert names.count("all_reduce") == 4 and names.count("broadcast") == 2 and names.count("barrier") == 1
        assert names.count("send" if rank % 2 == 0 else "recv") == 2
        assert all(t is not None and t > 0 for t, op in zip(section["events"]["columns"]["latency_s"], names, strict=True) if op not in ("send", "recv"))


@pytest.mark.timeout(60)
def test_check_report_diff_trace_summary_on_a_consistent_job(consistent, tmp_path):
    check = cli("check", str(consistent))
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith("consistent: 4 ranks, 3 groups")

    report = cli("report", str(consistent), "--json")
    assert report.returncode == 0, report.stderr
    rep = json.loads(report.stdout)
    assert [r["rank"] for r in rep["ranks"]] == [0, 1, 2, 3] and rep["timed"]
    ops = {o["op"]: o for o in rep["ops"]}
    assert ops["all_reduce"]["calls"] == 16 and ops["broadcast"]["calls"] == 8
    assert ops["all_reduce"]["busbw_gbps"] > 0 and ops["all_reduce"]["straggler_s"] >= 0
    assert rep["spread"]["collectives"]["min"] == rep["spread"]["collectives"]["max"] == 9
    text = cli("report", str(consistent)).stdout
    assert "median" in text and "straggler" in text

    same = cli("diff", str(consistent), str(consistent))
    assert (same.returncode, same.stdout.splitlines()[0]) == (0, f"no differences between {consistent} and {consistent}")

    out = tmp_path / "trace.json"
    trace = cli("trace", str(consistent), "-o", str(out))
    assert trace.returncode == 0, trace.stderr
    events = validate_chrome_trace(json.loads(out.read_text()))
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    complete = [e for e in events if e["ph"] == "X" and e.get("cat") == "collective"]
    assert len(complete) == 4 * 9  # send/recv too: timed to the program's own wait, never waited for by us
    assert sum(1 for e in events if e["ph"] == "i") == 0  # an untimed call would be an instant

    page = cli("view", str(consistent), "-o", str(tmp_path / "job.html"))
    assert (page.returncode, page.stdout.strip()) == (0, str(tmp_path / "job.html"))
    html = (tmp_path / "job.html").read_text()
    assert all(f'"file":"rank{r}.json"' in html for r in range(4))

    summary = cli("summary", str(consistent / "rank0.json"), "--by", "op", "--json")
    rows = {r["op"]: r for r in json.loads(summary.stdout)["rows"]}
    assert rows["all_reduce"]["calls"] == 4 and rows["all_reduce"]["busbw_p50_gbps"] is not None


@pytest.mark.timeout(DEADLINE_S + 30)
def test_a_rank_that_raises_still_leaves_every_dump(tmp_path):
    proc = torchrun(2, "-m", "commdebug", "run", "--out", "traces", "--", str(JOB), env={"JOB_BAD": "raise"}, cwd=tmp_path)
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in proc.stderr
    got = dumps(tmp_path / "traces")
    assert sorted(got) == [0, 1]
    assert got[1]["metadata"]["ended_by"] == "RuntimeError: rank 1 fails on purpose"
    check = cli("check", str(tmp_path / "traces"))
    assert check.returncode == 1
    assert "[missing] group default_pg[2] seq 2: rank 1 never issued it" in check.stdout


@pytest.fixture
def startup_hook():
    hook.install()
    try:
        yield
    finally:
        hook.uninstall()


@pytest.mark.timeout(DEADLINE_S + 30)
def test_environment_variables_record_an_unchanged_launch_line_and_survive_sigterm(tmp_path, startup_hook):
    env = {"COMMDEBUG": "1", "COMMDEBUG_OUT": "envtraces", "JOB_BAD": "sigterm", "JOB_BAD_RANK": "2", "JOB_PG_TIMEOUT": "10"}
    proc = torchrun(4, str(JOB), env=env, cwd=tmp_path)
    assert proc.returncode != 0  # rank 2 died of SIGTERM
    got = dumps(tmp_path / "envtraces")
    assert sorted(got) == [0, 1, 2, 3], proc.stderr[-3000:]
    assert got[2]["metadata"]["ended_by"] == "SIGTERM"
    assert got[2]["events"]["count"] == 4  # step 0: grad all_reduce, broadcast, pair all_reduce, send


@pytest.mark.timeout(DEADLINE_S + 30)
@pytest.mark.parametrize("capture", [[], ["--light"]], ids=["full", "light"])
def test_hang_check_names_the_rank_group_seq_and_line_in_ours_and_flight_recorder(tmp_path, capture):
    """Light: its C++ kernel records the calls after each op's first, and tracks them in flight."""
    env = {"JOB_BAD": "skip", "JOB_PG_TIMEOUT": "8", "JOB_FR_DIR": "fr", "TORCH_FR_BUFFER_SIZE": "1000"}
    proc = torchrun(2, "-m", "commdebug", "run", "--out", "traces", *capture, "--hang-timeout", "2", "--", str(JOB), env=env, cwd=tmp_path)
    assert proc.returncode != 0
    assert "commdebug: rank 0 stuck for" in proc.stderr and f"job.py:{SKIPPED_LINE}" in proc.stderr
    for folder in ("traces", "fr"):
        check = cli("check", str(tmp_path / folder), "--json")
        assert check.returncode == 1, check.stderr
        first = json.loads(check.stdout)["findings"][0]
        # default_pg per step: grad all_reduce, broadcast (the pair's all_reduce is on its own
        # group); in step 1 rank 0 is in the grad all_reduce (seq 2), rank 1 in the broadcast
        assert (first["kind"], first["seq"]) == ("mismatch", 2), first
        assert first["group"].startswith("default_pg")
        sides = {tuple(s["ranks"]): s for s in first["sides"]}
        assert sides[(0,)]["op"] == "all_reduce" and sides[(0,)]["source"].endswith(f"job.py:{SKIPPED_LINE}")
        assert sides[(1,)]["op"] == "broadcast" and sides[(1,)]["source"].endswith(f"job.py:{BROADCAST_LINE}")
        if folder == "traces":  # gloo's Flight Recorder marks nothing unfinished after the timeout error
            assert sides[(0,)]["in_flight"]
    text = cli("check", str(tmp_path / "traces")).stdout
    # two ranks, one against one: check names both sides, no majority (docs/ranks.md)
    assert "[mismatch] group default_pg[2] seq 2" in text and f"job.py:{SKIPPED_LINE}" in text and f"job.py:{BROADCAST_LINE}" in text


@pytest.mark.timeout(DEADLINE_S + 30)
def test_a_silent_size_mismatch_is_found(tmp_path):
    proc = torchrun(2, "-m", "commdebug", "run", "--out", "traces", "--", str(JOB), env={"JOB_BAD": "size"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]  # gloo does not notice
    check = cli("check", str(tmp_path / "traces"))
    assert check.returncode == 1
    first = next(line for line in check.stdout.splitlines() if line.startswith("1. "))
    assert first.startswith("1. [mismatch] group default_pg[2] seq 3: ")
    assert f"rank 0: broadcast 4.00 KiB float32 in Global at {JOB}:{BROADCAST_LINE}" in check.stdout
    assert f"rank 1: broadcast 8.00 KiB float32 in Global at {JOB}:{BROADCAST_LINE}" in check.stdout


@pytest.mark.timeout(DEADLINE_S + 30)
def test_run_tags_pipelining_imported_after_the_recording_started(tmp_path):
    proc = torchrun(2, "-m", "commdebug", "run", "--out", "traces", "--", str(ROOT / "tests" / "programs" / "pipeline_job.py"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import commdebug

    for rank, sends, recvs in ((0, "forward", "backward"), (1, "backward", "forward")):
        trace = commdebug.load(tmp_path / "traces" / f"rank{rank}.json")
        p2p = [(e.op, e.phase, e.microbatch, e.peer) for e in trace.events if e.op in ("send", "recv")]
        # the stage first infers shapes with untagged messages; then 2 microbatches: activations
        # 0 -> 1 in forward, gradients 1 -> 0 in backward, each tagged with its microbatch
        first = next(i for i, e in enumerate(p2p) if e[2] is not None)
        tagged = p2p[first:]
        assert all(mb is None for _, _, mb, _ in p2p[:first])
        expected = [("send", sends, mb, 1 - rank) for mb in (0, 1)] + [("recv", recvs, mb, 1 - rank) for mb in (0, 1)]
        assert sorted(tagged) == sorted(expected), p2p


# ---- one `commdebug run`, the ranks started by the program itself -----------------------------

SPAWNED = ROOT / "tests" / "programs" / "spawned.py"
ABORT_DEL_LINE = next(i for i, line in enumerate(SPAWNED.read_text().splitlines(), 1) if line.strip() == "abort()")


def commdebug_run(*args: str, cwd: Path, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """`python -m commdebug run ARGS` as a user types it (no torchrun), bounded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (ROOT, *pythonpath)))}
    return subprocess.run([sys.executable, "-m", "commdebug", "run", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=DEADLINE_S)


def commdebug_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("commdebug:")]


@pytest.mark.timeout(DEADLINE_S + 30)
def test_an_out_folder_with_braces_in_its_name_is_taken_literally(tmp_path):
    proc = commdebug_run("--out", "traces{x}", "--", str(SPAWNED), "solo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import commdebug

    trace = commdebug.load(tmp_path / "traces{x}" / "rank0.json")
    assert [e.op for e in trace.events] == ["all_reduce", "broadcast", "barrier"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces{x}"]
    assert commdebug_lines(proc.stderr)[-1] == "commdebug: program finished (exit 0); dump complete: traces{x}/rank0.json"


@pytest.mark.timeout(DEADLINE_S + 30)
def test_ranks_started_with_mp_spawn_are_recorded_with_the_run_options(tmp_path):
    # the user's own sitecustomize still runs in every process, the spawned ranks too
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import os\nwith open({str(tmp_path / 'pids')!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n")
    proc = commdebug_run("--out", "out", "--timing", "--ops", "all_reduce,broadcast", "--", str(SPAWNED), "spawn", cwd=tmp_path, pythonpath=(site,))
    assert proc.returncode == 0, proc.stderr[-3000:]
    started = {int(pid) for pid in (tmp_path / "pids").read_text().split()}
    assert sorted(p.name for p in (tmp_path / "out").glob("rank*")) == ["rank0.html", "rank0.json", "rank1.json"]
    import commdebug

    for rank in (0, 1):
        trace = commdebug.load(tmp_path / "out" / f"rank{rank}.json")
        meta = trace.metadata
        assert (meta["rank"], meta["world_size"], meta["backend"], meta["ended_by"]) == (rank, 2, "gloo", "exit")
        assert [e.op for e in trace.events] == ["all_reduce", "broadcast"]  # --ops: no barrier
        assert all(e.latency_s and e.latency_s > 0 for e in trace.events)  # --timing
        assert meta["pid"] in started
    lines = commdebug_lines(proc.stderr)
    assert lines[-1] == "commdebug: program finished (exit 0); dumps complete, written by the processes it started: out/rank0.json, out/rank1.json"


@pytest.mark.timeout(2 * DEADLINE_S + 30)
@pytest.mark.parametrize("mode, said", [("none", "no torch.distributed here"), ("quiet", "a world of 1, no collective")])
def test_a_program_that_issues_no_collective_says_it_recorded_nothing(tmp_path, mode, said):
    # "quiet" initialises torch.distributed (a world of 1) and destroys it: the line must not
    # say it never did; it says what is known, for both programs
    proc = commdebug_run("--out", "out", "--", str(SPAWNED), mode, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert said in proc.stdout
    assert commdebug_lines(proc.stderr) == [
        "commdebug: recorded nothing: the program (exit 0) issued no collective in this process and had no process group when "
        "it ended, and no Python process it started wrote a dump to out"]
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.timeout(DEADLINE_S + 30)
def test_an_abort_in_teardown_after_the_program_finished_leaves_a_complete_dump_and_says_so(tmp_path):
    import commdebug

    solo = commdebug_run("--out", "solo", "--", str(SPAWNED), "solo-abort", cwd=tmp_path)
    assert solo.returncode == -6, solo.stderr[-3000:]  # SIGABRT, after run_program returned
    assert commdebug_lines(solo.stderr)[-1] == "commdebug: program finished (exit 0); dump complete: solo/rank0.json"
    assert commdebug.load(tmp_path / "solo" / "rank0.json").metadata["ended_by"] == "exit"
    # its fault record says where the abort came; after a complete dump it is a note, not a failure
    assert (tmp_path / "solo" / "rank0.fault").is_file()
    check = cli("check", str(tmp_path / "solo"))
    assert check.returncode == 0 and check.stdout.startswith("consistent: "), check.stdout
    assert (f"note: rank 0: died of SIGABRT (a native abort), main thread at {SPAWNED}:{ABORT_DEL_LINE} in __del__ after its "
            "final dump was written, after the program's code ended: its dump is complete") in check.stdout, check.stdout

    spawned = commdebug_run("--out", "out", "--", str(SPAWNED), "spawn-abort", cwd=tmp_path)
    assert spawned.returncode == 1  # mp.spawn raises ProcessExitedException in the parent
    assert "terminated with signal SIGABRT" in spawned.stderr
    lines = commdebug_lines(spawned.stderr)
    for rank in (0, 1):
        assert commdebug.load(tmp_path / "out" / f"rank{rank}.json").metadata["ended_by"] == "exit"
        done = [line for line in lines if line.startswith(f"commdebug: rank {rank} (pid ")]
        assert done and done[0].endswith(f"finished; dump complete: {tmp_path / 'out'}/rank{rank}.json"), lines
    died = [line for line in lines if "died of SIGABRT after" in line]
    assert len(died) == 1 and "its dump out/rank" in died[0] and "is complete;" in died[0], lines


RAISING = '''\
def load(path):
    try:
        return {}[path]
    except KeyError as e:
        raise ValueError(f"cannot load {path}") from e


def train():
    try:
        load("ckpt")
    finally:
        print("cleanup")


train()
'''


@pytest.mark.timeout(DEADLINE_S + 30)
def test_a_raising_program_prints_the_traceback_python_prints_with_the_same_status(tmp_path):
    """No frame of commdebug or of the runpy calls that start the program: `python prog.py`'s
    traceback, chained exceptions included; for `-m`, `python -m`'s (with its two runpy frames)."""
    (tmp_path / "prog.py").write_text(RAISING)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(RAISING)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for plain, ours in ((["prog.py"], ["--", "prog.py"]), (["-m", "pkg.mod"], ["-m", "--", "pkg.mod"])):
        python = subprocess.run([sys.executable, *plain], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=DEADLINE_S)
        run = subprocess.run([sys.executable, "-m", "commdebug", "run", "--out", "out", *ours], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=DEADLINE_S)
        assert python.returncode == run.returncode == 1
        assert python.stdout == run.stdout == "cleanup\n"
        theirs = [line for line in run.stderr.splitlines() if not line.startswith("commdebug:")]
        assert theirs == python.stderr.splitlines(), run.stderr
        assert "The above exception was the direct cause" in python.stderr and "commdebug" not in "\n".join(theirs)


@pytest.mark.timeout(DEADLINE_S + 30)
def test_a_program_that_leaves_with_os_exit_still_leaves_its_dump(tmp_path):
    # os._exit runs no exit handler: the recording writes the dump first, from its own process
    # only (a forked child leaving the same way writes nothing), and says how the program ended
    import commdebug

    (tmp_path / "solo").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPAWNED_OUT": str(tmp_path / "solo")}
    proc = subprocess.run([sys.executable, "-m", "commdebug", "run", "--out", "solo", "--", str(SPAWNED), "solo-exit"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dumps after the child left: []" in proc.stdout, proc.stdout
    assert commdebug_lines(proc.stderr)[-1] == "commdebug: program ended by os._exit(0); dump complete: solo/rank0.json"
    trace = commdebug.load(tmp_path / "solo" / "rank0.json")
    assert trace.metadata["ended_by"] == "os._exit(0)"
    assert [e.op for e in trace.events] == ["all_reduce", "broadcast", "barrier"]
    check = cli("check", str(tmp_path / "solo"))
    assert check.returncode == 0 and check.stdout.startswith("consistent: "), check.stdout
    assert "rank 0: ended by os._exit(0); last barrier" in check.stdout, check.stdout
    watch = cli("watch", str(tmp_path / "solo"), "--once")
    assert watch.returncode == 0, watch.stdout + watch.stderr
