"""Verdicts you can trust on real jobs: `check` on real Flight Recorder dumps taken a moment
apart, two ranks with no majority, counts per rank and how each rank ended, and folders that mix
two runs.

The Flight Recorder dumps under tests/data/fr_gloo are real: a 2-rank gloo job written by
tests/programs/make_fr_dumps.py (all_reduce, broadcast, send/recv, all_gather, barrier). Tests
edit copies of them to model what a real job can show.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commdebug.analysis.check import check_path
from commdebug.formats.readers import iter_ranks, load_rank
from commdebug.render.check import render_check

ROOT = Path(__file__).resolve().parents[1]
FR = ROOT / "tests" / "data" / "fr_gloo"
FORMS = ("pickle", "json")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def fr_folder(tmp_path: Path, form: str, edit: Callable[[int, dict], None] | None = None) -> Path:
    """A copy of the real dumps in `form`, each passed through `edit(rank, data)` first."""
    out = tmp_path / form
    out.mkdir()
    for src in sorted((FR / form).iterdir()):
        rank = int(src.name.split("_")[-1].split(".")[0])
        data = pickle.loads(src.read_bytes()) if form == "pickle" else json.loads(src.read_text())
        if edit is not None:
            edit(rank, data)
        (out / src.name).write_bytes(pickle.dumps(data) if form == "pickle" else json.dumps(data).encode())
    return out


def status(data: dict) -> dict:
    [s] = data["pg_status"].values()
    return s


def set_status(data: dict, key: str, value: int) -> None:
    # the JSON form writes these numbers as strings; keep each form as torch writes it
    s = status(data)
    s[key] = str(value) if isinstance(s[key], str) else value


# ---------------------------------------------------------------- A. dumps taken a moment apart

def test_the_fixtures_are_what_torch_wrote():
    for form in FORMS:
        views = list(iter_ranks(FR / form))
        assert [v.rank for v in views] == [0, 1]
        for v in views:
            assert [e.op for e in v.events] == ["all_reduce", "broadcast", "all_gather", "barrier"]
            assert [e.seq for e in v.events] == [0, 1, 2, 3] and not any(e.in_flight for e in v.events)
    raw = pickle.loads((FR / "pickle" / "fr_trace_1").read_bytes())
    # gloo records no send/recv entry, yet counts them in pg_status: op_id, not
    # collective_seq_id, is what last_completed_collective counts
    assert [(e["collective_seq_id"], e["op_id"]) for e in raw["entries"]] == [(1, 1), (2, 2), (3, 4), (4, 5)]
    assert status(raw)["last_completed_collective"] == 5
    assert load_rank(FR / "pickle" / "fr_trace_0").events[-1].source == "tests/programs/make_fr_dumps.py:49"


@pytest.mark.parametrize("form", FORMS)
def test_a_rank_whose_dump_lags_one_completion_reads_unfinished(tmp_path, form):
    def lag(rank: int, data: dict) -> None:
        if rank == 1:  # dumped right after the barrier, before gloo marked it completed
            set_status(data, "last_completed_collective", 4)

    folder = fr_folder(tmp_path, form, lag)
    barrier = load_rank(folder / ("fr_trace_1" + (".json" if form == "json" else ""))).events[-1]
    assert barrier.op == "barrier" and barrier.in_flight
    assert not load_rank(folder / ("fr_trace_0" + (".json" if form == "json" else ""))).events[-1].in_flight


@pytest.mark.proc
@pytest.mark.parametrize("form", FORMS)
def test_completion_race_is_not_a_hang(tmp_path, form):
    def lag(rank: int, data: dict) -> None:
        if rank == 1:
            set_status(data, "last_completed_collective", 4)

    proc = cli("check", str(fr_folder(tmp_path, form, lag)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("consistent: 2 ranks, 1 group, 4 collectives per rank\n")
    [note] = [line for line in proc.stdout.splitlines() if "completed it" in line]
    assert note == ("note: group default_pg seq 3: unfinished in the dump of rank 1, but rank 0 completed it, "
                    "so every member issued it: the dumps were taken a moment apart, not a hang")


def test_completion_race_over_two_collectives(tmp_path):
    def lag(rank: int, data: dict) -> None:
        if rank == 0:  # op 3 was the send: all_gather (op 4) and barrier (op 5) read unfinished
            set_status(data, "last_completed_collective", 3)

    result = check_path(fr_folder(tmp_path, "pickle", lag))
    assert result.consistent
    assert any("seq 2-3: unfinished in the dump of rank 0, but rank 1 completed them" in n for n in result.notes)


@pytest.mark.proc
@pytest.mark.parametrize("form", FORMS)
def test_a_rank_that_never_issued_the_barrier_is_missing(tmp_path, form):
    def skip(rank: int, data: dict) -> None:
        if rank == 1:  # never reached the barrier
            data["entries"].pop()
            set_status(data, "last_enqueued_collective", 4)
            set_status(data, "last_completed_collective", 4)
        else:  # waits in it
            set_status(data, "last_completed_collective", 4)

    folder = fr_folder(tmp_path, form, skip)
    proc = cli("check", str(folder), "--json")
    assert proc.returncode == 1, proc.stderr
    [f] = json.loads(proc.stdout)["findings"]
    assert (f["kind"], f["group"], f["seq"]) == ("missing", "default_pg", 3)
    waiting, short = f["sides"]
    assert (waiting["ranks"], waiting["op"], waiting["in_flight"]) == ([0], "barrier", True)
    assert (short["ranks"], short["op"]) == ([1], "all_gather")


@pytest.mark.proc
@pytest.mark.parametrize("bad", [
    lambda d: d.update(entries=[{"profiling_name": "gloo:all_reduce", "input_sizes": [["x"]], "process_group": ["0", "p"]}]),
    lambda d: d.update(pg_status={"0": {"last_completed_collective": "many"}}),
    lambda d: d["entries"][0].update(process_group=7),
])
def test_malformed_flight_recorder_dumps_are_one_line(tmp_path, bad):
    folder = fr_folder(tmp_path, "json", lambda rank, d: bad(d) if rank == 0 else None)
    for verb in ("check", "report"):
        proc = cli(verb, str(folder))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"commdebug: error: {folder / 'fr_trace_0.json'}: ")


@pytest.mark.proc
def test_a_pickle_that_names_code_is_refused(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "fr_trace_0").write_bytes(pickle.dumps({"entries": [], "pg_config": {}, "x": Path("/")}))
    proc = cli("check", str(folder))
    assert proc.returncode == 2 and "not a plain Flight Recorder pickle" in proc.stderr


# ---------------------------------------------------------------- B. two ranks: no majority

@pytest.mark.parametrize("odd", [0, 1])
def test_two_ranks_disagree_without_calling_either_odd(tmp_path, odd):
    def bigger(rank: int, data: dict) -> None:
        if rank == odd:
            data["entries"][1]["input_sizes"] = data["entries"][1]["output_sizes"] = [[16]]

    result = check_path(fr_folder(tmp_path, "pickle", bigger))
    [f] = result.findings
    assert (f.kind, f.seq, f.odd_ranks) == ("mismatch", 1, [])
    assert f.message == "group default_pg seq 1: ranks issued different collectives; the 2 ranks disagree, 1 against 1 (no majority)"
    assert [s.ranks for s in f.sides] == [[0], [1]]  # in rank order, neither called odd
    text = render_check(result)
    assert "differs" not in text and "odd" not in text
    assert "     rank 0: broadcast" in text and "     rank 1: broadcast" in text
    assert f.to_dict()["odd_ranks"] == []


def test_a_majority_names_the_odd_ranks(tmp_path):
    from commdebug.analysis.check import check

    from synthetic import write_rank_dumps

    write_rank_dumps(tmp_path, ranks=4, layers=1, steps=1, odd_rank=2, odd_module="Transformer.layers.0.attention.wo",
                     dim=64, ffn=256, vocab=256, tokens=32)
    [f] = check(iter_ranks(tmp_path)).findings
    assert f.odd_ranks == [2] and f.message.endswith("rank 2 differs from the other 3")
    assert [s.ranks for s in f.sides] == [[0, 1, 3], [2]]


def _moved_broadcast(rank: int, data: dict) -> None:
    """Rank 1 broadcasts from another line (the same op, size and dtype)."""
    if rank == 1:
        frame = next(f for f in data["entries"][1]["frames"] if f["filename"].endswith("make_fr_dumps.py"))
        frame["line"] = 47


def test_a_call_site_difference_without_steps_to_judge_it_is_a_note(tmp_path):
    """Flight Recorder dumps record no steps: a call-site difference nothing after contradicts
    may be a rank-dependent branch, so it must not turn the job red."""
    result = check_path(fr_folder(tmp_path, "pickle", _moved_broadcast))
    assert result.consistent, [f.message for f in result.findings]
    [note] = [n for n in result.notes if "make_fr_dumps.py:47" in n]
    assert note.startswith("group default_pg seq 1: ") and "make_fr_dumps.py:43" in note and "branch taken once" in note


def test_a_call_site_difference_the_ranks_disagree_after_is_where_they_parted(tmp_path):
    def moved_then_bigger(rank: int, data: dict) -> None:
        _moved_broadcast(rank, data)
        if rank == 1:
            data["entries"][2]["input_sizes"] = [[8]]
            data["entries"][2]["output_sizes"] = [[16]]

    result = check_path(fr_folder(tmp_path, "pickle", moved_then_bigger))
    diverged, mismatch = result.findings
    assert (diverged.kind, diverged.seq, diverged.step, diverged.departed) == ("diverged", 1, None, [])
    assert diverged.message.endswith("history cannot decide: the dumps record no steps to compare with")
    assert [(s.ranks, s.source.rsplit("/", 1)[-1]) for s in diverged.sides] == [([0], "make_fr_dumps.py:43"), ([1], "make_fr_dumps.py:47")]
    assert (mismatch.kind, mismatch.seq) == ("mismatch", 2) and mismatch.message.endswith("it follows where the ranks parted, seq 1")
    assert "(step" not in render_check(result)  # no steps recorded, none invented


def test_side_wording_lives_in_the_renderer():
    from commdebug.analysis.check import Side
    from commdebug.render.check import describe_side

    assert not hasattr(Side, "describe")
    side = Side([0, 1, 2], "all_reduce", 1024, "float32", "Global", "train.py:3", True)
    assert describe_side(side) == "ranks 0-2: all_reduce 1.00 KiB float32 (unfinished) in Global at train.py:3"
    assert describe_side(Side([4])) == "rank 4: nothing"


# ---------------------------------------------------------------- C. per rank: counts, endings

def _synthetic(tmp_path: Path, ranks: int, meta: Callable[[int], dict[str, Any]] | None = None, **kw) -> Path:
    from synthetic import write_rank_dumps

    write_rank_dumps(tmp_path, ranks=ranks, layers=1, steps=1, dim=64, ffn=256, vocab=256, tokens=32, **kw)
    if meta is not None:
        for r in range(ranks):
            f = tmp_path / f"rank{r}.json"
            dump = json.loads(f.read_text())
            dump["commdebug"]["metadata"].update(meta(r))
            f.write_text(json.dumps(dump))
    return tmp_path


def test_header_counts_collectives_per_rank(tmp_path):
    folder = _synthetic(tmp_path, 2)
    result = check_path(folder)
    n = result.rank_summaries[0].collectives
    assert [s.collectives for s in result.rank_summaries] == [n, n] and result.collectives == 2 * n
    assert render_check(result).startswith(f"consistent: 2 ranks, 1 group, {n} collectives per rank\n")
    assert result.to_dict()["collectives_per_rank"] == {"min": n, "max": n}


def test_header_says_a_range_when_ranks_differ(tmp_path):
    def skip(rank: int, data: dict) -> None:
        if rank == 1:
            data["entries"].pop()
        # nobody completed the last call (a completed one would prove rank 1 issued it)
        set_status(data, "last_completed_collective", 4)

    text = render_check(check_path(fr_folder(tmp_path, "pickle", skip)))
    assert text.startswith("INCONSISTENT: 1 finding in 2 ranks, 1 group, 3-4 collectives per rank\n")


@pytest.mark.parametrize("form", FORMS)
def test_a_flight_recorder_record_short_of_calls_a_member_completed_is_a_note_not_missing(tmp_path, form):
    """Rank 1's dump lacks its last entry, but rank 0's pg_status says that call completed: rank 1
    issued it (its ring buffer or dump lost it), so it is no missing call."""
    def drop_last(rank: int, data: dict) -> None:
        if rank == 1:
            data["entries"].pop()

    result = check_path(fr_folder(tmp_path, form, drop_last))
    assert result.consistent, result.findings
    assert ("group default_pg: rank 1's record stops at seq 2, but rank 0's record shows seq 3 completed, so rank 1 "
            "issued it: the calls after that are known from the other members' records") in result.notes, result.notes


def test_each_rank_says_how_it_ended_and_its_last_collective(tmp_path):
    endings = {0: "exit", 1: "SIGTERM", 2: "RuntimeError: boom", 3: "exit"}
    folder = _synthetic(tmp_path, 4, lambda r: {"ended_by": endings[r]})
    result = check_path(folder)
    by_rank = {s.rank: s for s in result.rank_summaries}
    assert {r: s.ended_by for r, s in by_rank.items()} == endings
    last = by_rank[0].last
    assert last is not None and last.op and last.group and last.seq is not None and last.source
    text = render_check(result).splitlines()
    assert text[1].startswith("  ranks 0,3: ended by exit; last ") and f" at {last.source}" in text[1]
    assert text[2].startswith("  rank 1: ended by SIGTERM; last ")
    assert text[3].startswith("  rank 2: ended by RuntimeError: boom; last ")
    dumped = json.loads(json.dumps(result.to_dict()))
    assert dumped["rank_summaries"][1]["ended_by"] == "SIGTERM"
    assert dumped["rank_summaries"][1]["last"]["op"] == last.op


def test_an_error_ending_stays_one_short_line(tmp_path):
    gloo = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
            "Timed out waiting 8000ms for recv operation to complete")
    endings = {0: gloo, 1: "ValueError: first line\nsecond line"}
    result = check_path(_synthetic(tmp_path, 2, lambda r: {"ended_by": endings[r]}))
    lines = render_check(result).splitlines()
    assert lines[1].startswith("  rank 0: ended by RuntimeError: Timed out waiting 8000ms for recv operation to complete; last ")
    assert lines[2].startswith("  rank 1: ended by ValueError: first line...; last ")
    assert result.rank_summaries[0].ended_by == gloo  # the data keeps all of it


def test_a_last_call_that_raised_is_said_to_have_failed(tmp_path):
    """A rank that died of the error its last collective raised: the ending line says the call
    failed, not only how the rank ended (its error is in the dump)."""
    import commdebug
    from commdebug.model.dump import dump_text

    folder = _synthetic(tmp_path, 2, lambda r: {"ended_by": "DistBackendError: NCCL communicator was aborted"} if r == 0 else {})
    trace = commdebug.load(folder / "rank0.json")
    trace.update_event(trace.events[-1].index, error="DistBackendError: NCCL communicator was aborted")
    (folder / "rank0.json").write_text(dump_text(trace))
    result = check_path(folder)
    lines = render_check(result).splitlines()
    assert lines[1].startswith("  rank 0: ended by DistBackendError: NCCL communicator was aborted; last ") and lines[1].endswith(" (failed)"), lines
    assert not lines[2].endswith(" (failed)"), lines
    assert result.to_dict()["rank_summaries"][0]["last"]["failed"] is True


def test_flight_recorder_ranks_say_their_ending_is_unknown(tmp_path):
    text = render_check(check_path(FR / "pickle")).splitlines()
    assert text[1] == ("  ranks 0-1: ending not recorded (Flight Recorder dump); "
                       "last barrier #3 on default_pg at tests/programs/make_fr_dumps.py:49")


def test_many_ranks_are_summarised_in_few_lines(tmp_path):
    from commdebug.analysis.check import check
    from commdebug.model.rank_view import RankView
    from commdebug.model.trace import CollectiveEvent, GroupInfo

    world = 40
    group = GroupInfo("0", "default_pg", world, tuple(range(world)))

    def view(rank: int) -> RankView:
        e = CollectiveEvent(index=0, op="all_reduce", key="c10d.allreduce_", aten_op="", step=0, phase="forward",
                            module="Global", group=group, seq=0, dtype="float32", input_shapes=((4,),),
                            output_shapes=((4,),), input_bytes=16, output_bytes=16, size_bytes=16, busbw_factor=1.0,
                            source="train.py:9")
        ended = "SIGTERM" if rank % 10 == 3 else "exit"
        return RankView(rank, Path(f"rank{rank}.json"), {"rank": rank, "world_size": world, "ended_by": ended}, {"0": group}, [e])

    lines = render_check(check(view(r) for r in range(world))).splitlines()
    assert lines[1] == "  36 ranks: ended by exit; last all_reduce #0 on default_pg[40] at train.py:9"
    assert lines[2] == "  ranks 3,13,23,33: ended by SIGTERM; last all_reduce #0 on default_pg[40] at train.py:9"


# ---------------------------------------------------------------- D. a folder mixing two runs

def _runs(tmp_path: Path, ids: dict[int, str | None]) -> Path:
    return _synthetic(tmp_path, len(ids), lambda r: {} if ids[r] is None else {"run_id": ids[r]})


@pytest.mark.proc
def test_a_folder_mixing_two_runs_is_refused_by_every_verb(tmp_path):
    folder = _runs(tmp_path / "mixed", {0: "run-a", 1: "run-b", 2: "run-a", 3: "run-a"})
    line = f"commdebug: error: {folder / 'rank1.json'} belongs to another run (run_id run-b) than the other 3 dumps (run_id run-a)\n"
    good = _runs(tmp_path / "good", {0: "run-a", 1: "run-a", 2: "run-a", 3: "run-a"})
    for args in (("check", str(folder)), ("report", str(folder)), ("trace", str(folder), "-o", str(tmp_path / "t.json")),
                 ("view", str(folder), "-o", str(tmp_path / "v.html")), ("diff", str(good), str(folder))):
        proc = cli(*args)
        assert (proc.returncode, proc.stderr) == (2, line), args
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "v.html").exists()


@pytest.mark.proc
def test_a_tie_between_two_runs_names_both(tmp_path):
    folder = _runs(tmp_path, {0: "run-a", 1: "run-b", 2: "run-b", 3: "run-a"})
    proc = cli("check", str(folder))
    assert proc.returncode == 2
    assert proc.stderr == (f"commdebug: error: {folder}: the dumps come from 2 runs, none the majority: "
                           f"{folder / 'rank0.json'}, {folder / 'rank3.json'} (run_id run-a); "
                           f"{folder / 'rank1.json'}, {folder / 'rank2.json'} (run_id run-b)\n")


def test_one_run_or_no_run_ids_is_fine(tmp_path, capsys):
    from commdebug.cli import main  # in this process: an interpreter per call costs seconds

    for name, ids in (("same", {0: "r", 1: "r"}), ("none", {0: None, 1: None}), ("some", {0: "r", 1: None})):
        folder = _runs(tmp_path / name, ids)
        for verb in ("check", "report"):
            assert main([verb, str(folder)]) == 0, (name, verb, capsys.readouterr())


def test_run_id_is_read_cheaply_and_only_from_keys(tmp_path):
    from commdebug.formats.readers import run_id_of

    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"fqn": "Global", "children": [], "x": 'a "run_id": "fake" here',
                             "commdebug": {"metadata": {"run_id": "r\u00e9al\"1"}}}))
    assert run_id_of(f) == 'r\u00e9al"1'
    f.write_text("{not json")
    assert run_id_of(f) is None  # reading it later says what is wrong
    assert run_id_of(FR / "pickle" / "fr_trace_0") is None


def test_a_short_rank_is_shown_with_its_own_last_call(tmp_path):
    """Found on torchtitan's plan: rank 3 ran one step of a copied script and the finding showed
    rank 3's last call with another rank's source line."""
    folder = _synthetic(tmp_path, 4)
    f = folder / "rank3.json"
    dump = json.loads(f.read_text())
    events = dump["commdebug"]["events"]
    keep = events["count"] - 5
    events["columns"] = {k: v[:keep] for k, v in events["columns"].items()}
    events["count"] = keep
    strings = events["strings"]
    strings.append("other_script.py:7")
    events["columns"]["source"][keep - 1] = len(strings) - 1
    f.write_text(json.dumps(dump))
    result = check_path(folder)
    [missing] = [x for x in result.findings if x.kind == "missing"]
    short = [s for s in missing.sides if s.ranks == [3]]
    assert short and short[0].source == "other_script.py:7" and short[0].last_call
    assert "     rank 3 (last call on the group): " in render_check(result)
    assert missing.to_dict()["sides"][-1]["last_call"] is True


NCCL_FR = ROOT / "tests" / "data" / "fr_nccl"


def test_a_real_nccl_dump_whose_pg_status_lags_its_entries_is_consistent(tmp_path):
    """A real NCCL dump (H100, NCCL 2.28, tests/data/fr_nccl/README.md): pg_status says 3
    collectives completed, the entries say all 18 did. It was called unfinished at seq 3."""
    result = check_path(NCCL_FR)
    assert result.consistent, result.findings
    text = render_check(result)
    assert text.startswith("consistent: 1 rank, 1 group, 18 collectives per rank\n"), text
    assert "unfinished" not in text, text
    view = load_rank(NCCL_FR / "fr_trace_0")
    assert [e.in_flight for e in view.events] == [False] * 18
    assert [e.latency_s is not None for e in view.events] == [True] * 3 + [False] * 15  # only retired work has a duration

    # an entry that says it is still running, past what pg_status counts, is unfinished
    data = pickle.loads((NCCL_FR / "fr_trace_0").read_bytes())
    data["entries"][-1]["state"] = "started"
    (tmp_path / "fr_trace_0").write_bytes(pickle.dumps(data))
    result = check_path(tmp_path)
    assert not result.consistent
    assert "reduce_scatter #17 on default_pg[1] at " in render_check(result) and "(unfinished)" in render_check(result)
