"""One job from per-node folders, and a node's folder told as it is (docs/ranks.md, "A job
over several hosts"), on synthetic dumps of a 4-rank job whose two nodes each wrote their own
folder, read by every verb in this process. The same on a real two-node torchrun job is in
tests/test_nodes.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from commdebug.cli import main

from synthetic import rank_dumps

MODEL = {"layers": 1, "dim": 64, "ffn": 256, "vocab": 256, "tokens": 32}


def write_nodes(root: Path, *, run_id: str = "run-1", placement: bool = True, steps: int = 2) -> Path:
    """A 4-rank job (one group of 4) whose node k wrote ranks 2k and 2k+1 to root/node<k>, as
    torchrun's agents with --out run/node<k> do; `placement`: the dumps say LOCAL_WORLD_SIZE
    and the node rank (dumps from before they were recorded do not)."""
    for rank, dump in rank_dumps(ranks=4, world_size=4, steps=steps, **MODEL):
        node = rank // 2
        meta = dump["commdebug"]["metadata"]
        meta.update(hostname=f"node{node}", run_id=run_id, pid=1000 + rank, ended_by="exit")
        if placement:
            meta.update(local_rank=rank % 2, local_world_size=2, node_rank=node)
        folder = root / f"node{node}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{rank}.json").write_text(json.dumps(dump))
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture
def job(tmp_path) -> Path:
    return write_nodes(tmp_path / "run")


def test_the_parent_of_node_folders_is_one_job_for_every_verb(job, capsys, tmp_path):
    status, out, _ = run(capsys, "check", job)
    assert status == 0 and out.startswith("consistent: 4 ranks, 1 group"), out
    assert run(capsys, "check", job / "node0", job / "node1")[1] == out  # the folders named together: the same job
    status, out, _ = run(capsys, "check", job, "--json")
    verdict = json.loads(out)
    assert (verdict["ranks_present"], verdict["ranks_absent"], verdict["world_size"]) == ([0, 1, 2, 3], [], 4)
    status, out, _ = run(capsys, "report", job, "--json")
    assert status == 0 and [(r["rank"], r["host"]) for r in json.loads(out)["ranks"]] == [(0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")]
    assert all(r["straggler_s"] is not None for r in json.loads(out)["ranks"])
    status, out, _ = run(capsys, "summary", job)
    assert status == 0 and out.startswith("commdebug summary by op: ranks 0-3 of 4 on node0, node1,"), out
    status, out, _ = run(capsys, "trace", job, "-o", tmp_path / "t.json")
    names = {e["args"]["name"] for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["name"] == "process_name"}
    assert status == 0 and names == {"rank 0 (node0)", "rank 1 (node0)", "rank 2 (node1)", "rank 3 (node1)"}
    status, out, _ = run(capsys, "view", job / "node0", job / "node1")
    assert status == 0 and out.strip() == str(job / "index.html") and (job / "index.html").is_file()  # the folder they share
    status, out, _ = run(capsys, "diff", job, job)
    assert status == 0, out
    status, out, _ = run(capsys, "watch", job, "--once", "--json")
    frame = json.loads(out)
    assert status == 0 and [r["rank"] for r in frame["ranks"]] == [0, 1, 2, 3] and frame["over"] and not frame["elsewhere"]
    status, out, _ = run(capsys, "estimate", job, "--cluster", "h100-ib400", "--json")
    assert status == 0 and json.loads(out)["ranks"] == 4, out


def test_a_node_folder_alone_is_consistent_among_its_ranks_and_names_the_others(job, capsys):
    node1 = job / "node1"
    status, out, _ = run(capsys, "check", node1)
    assert status == 0, out
    assert out.splitlines()[0] == "consistent among ranks 2-3 of 4: 2 ranks, 1 group, 18 collectives per rank"
    assert f"  ranks 0-1: not in {node1} (see the note)" in out.splitlines()
    note = (f"note: ranks 0-1 of 4 are not in {node1} (no dump, stream or fault record of theirs): they may be in "
            f"{job / 'node0'} beside it; read the parent folder for the whole job")
    assert note in out.splitlines() and "no_dump" not in out
    verdict = json.loads(run(capsys, "check", node1, "--json")[1])
    assert (verdict["consistent"], verdict["ranks_present"], verdict["ranks_absent"]) == (True, [2, 3], [0, 1])
    # figures that need every member of a group: unknown, as with --ranks, with the same note
    status, out, _ = run(capsys, "report", node1)
    assert status == 0 and out.startswith(f"commdebug report: 2 ranks of 4 (ranks 0-1 not in {node1}: see the note)")
    rows = json.loads(run(capsys, "report", node1, "--json")[1])
    assert [r["straggler_s"] for r in rows["ranks"]] == [None, None] and rows["notes"][0] == note[len("note: "):]
    assert any("straggler time unknown ('?') where the ranks not in" in n for n in rows["notes"])
    status, out, _ = run(capsys, "summary", node1)
    assert out.startswith("commdebug summary by op: ranks 2-3 of 4 on node1,") and note in out
    frame = json.loads(run(capsys, "watch", node1, "--once", "--json")[1])
    assert (frame["missing"], frame["elsewhere"], frame["over"]) == ([], [0, 1], True)  # never "no stream yet" from them
    # measured beside predicted: each call's least latency is over the ranks present, and it says so
    estimate = json.loads(run(capsys, "estimate", node1, "--cluster", "h100-ib400", "--json")[1])
    assert estimate["ranks"] == 2 and estimate["notes"][0].startswith(note[len("note: "):] + "; each call's measured time is its least")


def test_a_rank_missing_from_its_own_nodes_folder_is_still_a_rank_without_a_dump(job, capsys):
    (job / "node1" / "rank3.json").unlink()
    status, out, _ = run(capsys, "check", job)
    assert status == 1 and "[no_dump] rank 3 of 4 left no dump" in out
    status, out, _ = run(capsys, "check", job / "node1")  # node 1 ran ranks 2-3: rank 3 belongs here
    assert status == 1 and out.startswith("INCONSISTENT among rank 2 of 4:") and "[no_dump] rank 3 of 4 left no dump" in out
    assert "ranks 0-1 of 4 are not in" in out
    watch = json.loads(run(capsys, "watch", job / "node1", "--once", "--json")[1])
    assert (watch["missing"], watch["elsewhere"], watch["over"]) == ([3], [0, 1], False)


def test_a_rank_that_left_a_fault_record_is_judged_here(job, capsys):
    (job / "node1" / "rank3.json").unlink()
    (job / "node0" / "rank1.json").rename(job / "node0" / "rank1.json.bak")
    (job / "node0" / "rank1.fault").write_text("commdebug fault record 1\nrank: 1\npid: 1001\nsignal: 9\n")
    status, out, _ = run(capsys, "check", job / "node0")
    assert status == 1 and "[no_dump] rank 1 of 4 left no dump" in out and "ranks 2-3 of 4 are not in" in out


def test_without_placement_a_missing_rank_between_two_of_one_host_belongs_there(tmp_path, capsys):
    job = write_nodes(tmp_path / "old", placement=False)
    status, out, _ = run(capsys, "check", job / "node1")
    assert status == 0 and out.startswith("consistent among ranks 2-3 of 4")
    shutil.copy(job / "node0" / "rank0.json", job / "node1" / "rank0.json")  # node1's host now spans ranks 0-3 without rank 1
    meta_file = job / "node1" / "rank0.json"
    dump = json.loads(meta_file.read_text())
    dump["commdebug"]["metadata"]["hostname"] = "node1"
    meta_file.write_text(json.dumps(dump))
    status, out, _ = run(capsys, "check", job / "node1")
    assert status == 1 and "[no_dump] rank 1 of 4 left no dump" in out


def test_two_runs_in_one_tree_or_one_rank_in_two_places_are_refused_naming_the_files(tmp_path, capsys):
    job = write_nodes(tmp_path / "run")
    other = write_nodes(tmp_path / "other", run_id="run-2")
    shutil.copy(other / "node1" / "rank3.json", job / "node1" / "rank3.json")
    for verb in ("check", "report", "summary", "view", "trace", "overlap", "diff"):
        extra = {"trace": ("-o", tmp_path / "t.json"), "diff": (other,)}.get(verb, ())
        status, out, err = run(capsys, verb, job, *extra)
        assert (status, err) == (2, f"commdebug: error: {job / 'node1' / 'rank3.json'} belongs to another run (run_id run-2) than "
                                    "the other 3 dumps (run_id run-1)\n"), (verb, out)
    job = write_nodes(tmp_path / "again")
    shutil.copy(job / "node1" / "rank2.json", job / "node0" / "rank2.json")
    status, _, err = run(capsys, "watch", job, "--once")  # watch too: it keeps the newest run, never a rank twice
    assert status == 2 and err.startswith("commdebug: error: rank 2 is in two places")
    status, _, err = run(capsys, "check", job)
    assert status == 2 and err == (f"commdebug: error: rank 2 is in two places: {job / 'node0' / 'rank2.json'} and "
                                   f"{job / 'node1' / 'rank2.json'}; a job's ranks are read from one file each (name each "
                                   "folder once, and leave out copies and other runs' folders)\n")
    status, _, err = run(capsys, "check", tmp_path / "empty-parent")
    assert status == 2 and err.endswith("no such file or folder\n")
    (tmp_path / "empty-parent" / "node0").mkdir(parents=True)
    status, _, err = run(capsys, "check", tmp_path / "empty-parent")
    assert status == 2 and "no rank dumps in this folder" in err


def test_a_parent_with_one_nodes_folder_yet_names_the_parent(job, capsys):
    shutil.rmtree(job / "node1")  # node 1's folder not copied in (yet)
    status, out, _ = run(capsys, "check", job)
    assert status == 0 and out.startswith("consistent among ranks 0-1 of 4: 2 ranks"), out
    assert (f"note: ranks 2-3 of 4 are not in {job} (no dump, stream or fault record of theirs): they may be on the other "
            "nodes; read every node's folder together for the whole job (commdebug check DIR1 DIR2, or their parent folder)") in out
