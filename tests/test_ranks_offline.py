"""`check`, `report`, `diff` and `trace` on folders of per-rank dumps recorded on the fake
backend (one process playing each rank of a rank-dependent program), plus the CLI's handling
of bad input: one line, the right exit status, nothing overwritten."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commdebug.analysis.check import check_path
from commdebug.analysis.report import report_path

from chrome_trace_rules import validate_chrome_trace

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "fake_ranks.py"
LINES = PROGRAM.read_text().splitlines()


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(LINES, 1) if text in line)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    proc = subprocess.run([sys.executable, str(PROGRAM), str(out), "ok,skip,size,p2p,timed"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_consistent_folder_exits_0(folders):
    proc = cli("check", str(folders / "ok"))
    # per rank, not summed: the even ranks also all_gather on their group; each rank's last call
    # (ranks 0 and 1 end with their send/recv) and its ending (the `with` block ended normally)
    at = f"at {PROGRAM}:"
    assert (proc.returncode, proc.stdout) == (0, "consistent: 4 ranks, 2 groups, 4-6 collectives per rank\n"
        f"  rank 0: the CommDebugMode context ended normally; last send to rank 1 on default_pg[4] {at}{line_of('dist.send(')}\n"
        f"  rank 1: the CommDebugMode context ended normally; last recv from rank 0 on default_pg[4] {at}{line_of('dist.recv(')}\n"
        f"  ranks 2-3: the CommDebugMode context ended normally; last all_reduce #3 on default_pg[4] {at}{line_of('dist.all_reduce(torch.ones(16))')}\n")


def test_skipped_collective_names_the_rank_that_stopped_short(folders):
    result = check_path(folders / "skip")
    [f] = result.findings
    assert (f.kind, f.group, f.seq) == ("missing", "default_pg[4]", 3)
    ahead, short = f.sides
    assert ahead.ranks == [0, 1, 2] and ahead.op == "all_reduce" and ahead.size_bytes == 64
    assert ahead.source.endswith(f"fake_ranks.py:{line_of('dist.all_reduce(torch.ones(16))')}")
    assert short.ranks == [3] and short.size_bytes == 4096  # what rank 3 did last on the group


def test_different_size_names_the_odd_rank(folders):
    proc = cli("check", str(folders / "size"), "--json")
    assert proc.returncode == 1
    [f] = json.loads(proc.stdout)["findings"]
    assert (f["kind"], f["seq"]) == ("mismatch", 2)
    sides = {tuple(s["ranks"]): s["size_bytes"] for s in f["sides"]}
    assert sides == {(0, 1, 3): 4096, (2,): 8192}
    assert f["odd_ranks"] == [2] and f["message"].endswith("rank 2 differs from the other 3")


def test_send_without_receive(folders):
    [f] = check_path(folders / "p2p").findings
    assert (f.kind, f.seq) == ("unmatched", 1)
    assert f.message == "group default_pg[4]: send #1 from rank 0 to rank 1 has no matching receive on rank 1"


def test_missing_rank_dump_and_bad_input(folders, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for r in (0, 1, 3):
        (partial / f"rank{r}.json").write_text((folders / "ok" / f"rank{r}.json").read_text())
    proc = cli("check", str(partial))
    assert proc.returncode == 1 and "[no_dump] rank 2 of 4 left no dump" in proc.stdout
    (partial / "rank2.json").write_text("{not json")
    for verb in ("check", "diff"):
        args = (str(partial),) if verb == "check" else (str(partial), str(folders / "ok"))
        proc = cli(verb, *args)
        assert proc.returncode == 2, (verb, proc.stdout)
        assert proc.stderr == f"commdebug: error: {partial / 'rank2.json'}: not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)\n"
    assert cli("check", str(tmp_path / "nowhere")).stderr == f"commdebug: error: {tmp_path / 'nowhere'}: no such file or folder\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli("report", str(empty))
    assert proc.returncode == 2 and "no rank dumps in this folder" in proc.stderr


def test_report_pairs_calls_across_ranks_for_stragglers(folders):
    rep = report_path(folders / "timed")
    by_rank = {r.rank: r for r in rep.ranks}
    # rank 2 arrives late: the others wait 5 ms in each of its group's collectives
    assert by_rank[2].straggler_s == pytest.approx(0.0)
    default_pg_calls = 4  # per rank: two all_reduces per step
    assert by_rank[1].straggler_s == pytest.approx(0.005 * default_pg_calls)
    assert by_rank[0].straggler_s == pytest.approx(0.005 * (default_pg_calls + 2))  # + its evens all_gathers
    spread = rep.spread("straggler_s")
    assert (spread["min_rank"], spread["max_rank"]) == (2, 0)
    text = cli("report", str(folders / "timed")).stdout
    assert "min" in text.splitlines()[7] and "(r2)" in text.splitlines()[7]


@pytest.fixture(scope="module")
def same6(tmp_path_factory) -> Path:
    """6 ranks, 20 steps, every member of each call timed alike (latencies in tenths, which no
    binary float holds: the sums that should cancel gave 5.7e-14 s before they were exact)."""
    out = tmp_path_factory.mktemp("same")
    proc = subprocess.run([sys.executable, str(PROGRAM), str(out), "same", "6"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out / "same"


def _op_rows(text: str) -> dict[str, list[str]]:
    """The per-op table of `report`'s text: op -> its cells."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["op", "calls"])
    rows = {}
    for line in lines[head + 1:]:
        if not line.strip():
            break
        rows[line.split()[0]] = line.split()
    return rows


def test_straggler_time_of_calls_every_member_timed_alike_is_exactly_0(same6):
    data = json.loads(cli("report", str(same6), "--json").stdout)
    assert [r["straggler_s"] for r in data["ranks"]] == [0.0] * 6
    timed = {o["op"]: o["straggler_s"] for o in data["ops"] if o["timed_calls"]}
    assert timed == {"all_reduce": 0.0, "all_gather": 0.0}
    assert data["spread"]["straggler_s"]["max"] == 0.0
    text = cli("report", str(same6)).stdout
    rows = _op_rows(text)
    assert rows["all_reduce"][-2:] == ["0", "s"] and rows["all_gather"][-2:] == ["0", "s"], text
    assert not re.search(r"\de-\d", text), text  # no 5.68e-05 ns anywhere


def test_straggler_time_is_unknown_where_ranks_leaves_out_members_of_a_group(same6):
    # ranks 0-1: both groups (all 6 ranks; the even ranks 0, 2, 4) lack members
    data = json.loads(cli("report", str(same6), "--ranks", "0-1", "--json").stdout)
    assert [r["straggler_s"] for r in data["ranks"]] == [None, None]
    assert {o["op"]: o["straggler_s"] for o in data["ops"] if o["timed_calls"]} == {"all_reduce": None, "all_gather": None}
    assert data["spread"]["straggler_s"] is None
    [note] = [n for n in data["notes"] if n.startswith("straggler time unknown")]
    assert note == ("straggler time unknown ('?') where --ranks 0-1 leaves out members of the call's group "
                    "(2 groups: default_pg[6], group 1[3]): a call's least latency is over every member")
    text = cli("report", str(same6), "--ranks", "0-1").stdout
    rows = _op_rows(text)
    assert rows["all_reduce"][-1] == "?" and rows["all_gather"][-1] == "?", text
    assert f"note: {note}" in text
    # the even ranks are all of their group: its all_gather is known; the all_reduce is not
    data = json.loads(cli("report", str(same6), "--ranks", "0,2,4", "--json").stdout)
    assert {o["op"]: o["straggler_s"] for o in data["ops"] if o["timed_calls"]} == {"all_reduce": None, "all_gather": 0.0}
    assert [r["straggler_s"] for r in data["ranks"]] == [None] * 3  # each rank's all_reduce: unknown
    # --steps keeps every rank: every call's least is known
    data = json.loads(cli("report", str(same6), "--steps", "3-5", "--json").stdout)
    assert [r["straggler_s"] for r in data["ranks"]] == [0.0] * 6


def test_diff_of_two_plans_and_of_a_plan_with_itself(folders):
    same = cli("diff", str(folders / "ok"), str(folders / "ok"))
    assert same.returncode == 0
    changed = cli("diff", str(folders / "ok"), str(folders / "size"), "--json")
    assert changed.returncode == 1
    [c] = json.loads(changed.stdout)["changes"]
    assert (c["rank"], c["module"], c["phase"], c["group"]) == (2, "Global", "forward", "default_pg[4]")
    assert (c["calls_a"], c["calls_b"], c["bytes_b"] - c["bytes_a"]) == (4, 4, 4096)
    text = cli("diff", str(folders / "ok" / "rank3.json"), str(folders / "skip" / "rank3.json")).stdout
    assert text.splitlines()[1] == "Global [forward] c10d.allreduce_ on default_pg[4]: 4 -> 3 calls, 8.12 KiB -> 8.06 KiB"
    mixed = cli("diff", str(folders / "ok"), str(folders / "ok" / "rank0.json"))
    assert mixed.returncode == 2 and "compare a dump with a dump, or a folder with a folder" in mixed.stderr


def test_diff_says_how_each_side_ended_where_the_endings_differ_without_calling_it_a_difference(folders, tmp_path):
    """A crashed run has fewer calls; the diff says why in a note. The same calls ended
    otherwise are no difference: a plan's regression test compares calls."""
    import shutil

    crashed = tmp_path / "crashed"
    shutil.copytree(folders / "ok", crashed)
    dump = crashed / "rank1.json"
    data = json.loads(dump.read_text())
    meta = data["commdebug"]["metadata"]
    meta["ended_by"] = "RuntimeError: [/__w/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:9098"
    dump.write_text(json.dumps(data))
    same = cli("diff", str(folders / "ok"), str(crashed))
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.splitlines() == [f"no differences between {folders / 'ok'} and {crashed}",
                                        "note: rank 1 ended by context exit in a, by RuntimeError: Connection closed by peer [127.0.0.1]:9098 in b"]
    endings = json.loads(cli("diff", str(folders / "ok"), str(crashed), "--json").stdout)["endings"]
    assert endings == [{"rank": 1, "a": "context exit", "b": meta["ended_by"]}]


def test_chrome_trace_of_a_folder(folders, tmp_path):
    out = tmp_path / "t.json"
    proc = cli("trace", str(folders / "timed"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    events = validate_chrome_trace(json.loads(out.read_text()))
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 0}
    # a track per group; calls that overlap on a group (these made-up latencies are longer
    # than the gaps between calls) go to extra lanes so complete events never overlap
    assert {"steps", "default_pg[4]", "group 1[2]", "default_pg[4] (2)"} <= tracks
    x = [e for e in events if e["ph"] == "X" and e.get("cat") == "collective"]
    assert {e["args"]["op"] for e in x} == {"all_reduce", "all_gather"}
    assert all(e["dur"] in (pytest.approx(1000.0), pytest.approx(6000.0)) for e in x)  # microseconds
    steps = [e for e in events if e.get("cat") == "step" and e["pid"] == 0]
    assert [e["args"]["step"] for e in steps] == [0, 1]
    # a bad -o keeps nothing half-written and says why in one line
    out.write_text("keep me")
    bad = cli("trace", str(folders / "timed" / "nope"), "-o", str(out))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and out.read_text() == "keep me"


def test_placeholders_in_file_names(folders, world, tmp_path):
    from commdebug import CommDebugMode
    from commdebug.errors import CommDebugError

    comm = CommDebugMode()
    with comm:
        pass
    comm.generate_json_dump(str(tmp_path / "d_{rank}_of_{world_size}.json"))
    comm.log_comm_debug_tracing_table_to_file(str(tmp_path / "t_{rank}.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d_0_of_8.json", "t_0.txt"]
    with pytest.raises(CommDebugError, match=r"unknown placeholder \{ranks\}"):
        comm.generate_json_dump(str(tmp_path / "d_{ranks}.json"))
    proc = cli("view", str(folders / "ok" / "rank1.json"), "-o", str(tmp_path / "v{rank}of{world_size}.html"))
    assert proc.returncode == 0 and (tmp_path / "v1of4.html").is_file()


def test_chrome_trace_of_a_folder_with_a_cluster_adds_predicted_tracks_only(folders, tmp_path):
    from commdebug.estimate import PRESETS, predict_events
    from commdebug.formats.readers import iter_ranks

    plain, pred = tmp_path / "plain.json", tmp_path / "pred.json"
    assert cli("trace", str(folders / "timed"), "-o", str(plain)).returncode == 0
    proc = cli("trace", str(folders / "timed"), "-o", str(pred), "--cluster", "h100-ib400")
    assert proc.returncode == 0 and "predicted spans" in proc.stdout, proc.stderr
    events = validate_chrome_trace(json.loads(pred.read_text()))
    tracks = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "predicted"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    views = list(iter_ranks(folders / "timed"))
    # one predicted track per rank, named for the cluster
    assert sorted(pid for pid, _ in tracks) == sorted(v.rank for v in views)
    assert all(names[t] == "predicted on h100-ib400" for t in tracks)
    for view in views:
        spans = [e for e in events if e.get("cat") == "predicted" and e["pid"] == view.rank]
        expected = [s for s in predict_events(view.events, PRESETS["h100-ib400"], rank=view.rank).seconds if s is not None]
        assert [e["dur"] for e in spans] == pytest.approx([s * 1e6 for s in expected])
        assert all(e["args"]["predicted"] is True for e in spans)
    # the measured tracks are exactly what the trace without a cluster has
    assert [e for e in events if (e["pid"], e["tid"]) not in tracks] == json.loads(plain.read_text())["traceEvents"]
    bad = cli("trace", str(folders / "timed"), "-o", str(pred), "--cluster", "nowhere")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nowhere: neither a preset" in bad.stderr
