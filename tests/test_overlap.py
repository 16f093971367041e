"""Exposed communication (issue 37): torch.profiler traces read as collectives and time (a real
NCCL trace, a gloo job's own traces), ``commdebug overlap`` against HolisticTraceAnalysis,
``commdebug run --profile-steps`` joined to the dumps (an overlapped and a blocking program, per
module), and bad inputs."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NCCL_TRACE = ROOT / "tests" / "data" / "kineto" / "nccl_data.json.gz"
PROFILED = ROOT / "tests" / "programs" / "profiled_job.py"
OVERLAP = ROOT / "tutorials" / "programs" / "13_overlap.py"
DEADLINE_S = 150
HTA_PCT = 14.31  # HolisticTraceAnalysis 0.5.0 on NCCL_TRACE (tests/data/kineto/README.md)

sys.path.insert(0, str(ROOT / "bench"))
from ports import free_port  # noqa: E402  (the one way to find free ports: bench/ports.py)


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _ranks(cmd: list[str], out: Path, world: int = 2, done: str | None = None) -> None:
    """`cmd` on `world` gloo ranks (one process each), within the deadline; gloo's teardown abort
    after a rank finished (torch 2.13, docs/ranks.md) is accepted where `done` was printed."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=out))
    deadline = time.monotonic() + DEADLINE_S
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            finished = done is not None and done in stdout
            assert p.returncode == 0 or (finished and p.returncode == -6), f"rank exited {p.returncode}:\n{stdout}\n{stderr[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# ---- a real NCCL trace -------------------------------------------------------------------------

def test_the_nccl_trace_is_its_collectives_with_bytes_phases_and_kernel_times():
    from commdebug.formats.readers import load_rank

    view = load_rank(NCCL_TRACE)
    assert (view.rank, view.metadata["world_size"], view.source_format) == (0, 2, "torch-profiler")
    ops = Counter(e.op for e in view.events)
    assert ops == {"all_reduce": 15, "broadcast": 6}  # the 6 waits are no collectives
    assert sum(e.size_bytes for e in view.events if e.op == "all_reduce") == 306_684_384
    assert sum(e.size_bytes for e in view.events if e.op == "broadcast") == 638_712
    assert {e.phase for e in view.events if e.op == "all_reduce"} == {"backward"}  # DDP's, in autograd
    assert {e.phase for e in view.events if e.op == "broadcast"} == {"forward"}
    assert {e.step for e in view.events} == {4, 5, 6}
    assert all(e.latency_s is not None and e.latency_s > 0 for e in view.events)  # each call's kernel
    assert [e.seq for e in view.events] == list(range(21))  # no "Seq" in this trace: the group's order
    assert {e.group.label for e in view.events} == {"default_pg[2]"}
    assert any("no sequence numbers" in n for n in view.notes)


@pytest.mark.proc
def test_overlap_of_the_nccl_trace_is_htas_figure():
    exact = json.loads(cli("overlap", str(NCCL_TRACE), "--json").stdout)
    rounded = json.loads(cli("overlap", str(NCCL_TRACE), "--json", "--round-us").stdout)
    (rank,) = exact["ranks"]
    assert abs(100 * rank["overlap_ratio"] - HTA_PCT) < 1.0  # HTA rounds times inward: 14.76 exact
    assert round(100 * rounded["ranks"][0]["overlap_ratio"], 2) == HTA_PCT
    assert rank["device"] == "gpu" and rank["steps"] == [4, 5, 6] and rank["calls"] == 14  # the last step left out
    assert abs(rank["comm_s"] - rank["overlap_s"] - rank["exposed_s"]) < 1e-12
    rows = exact["rows"]
    assert {r["op"] for r in rows} == {"all_reduce", "broadcast"}
    assert abs(sum(r["exposed_s"] for r in rows) - rank["exposed_s"]) < 1e-9
    steps = json.loads(cli("overlap", str(NCCL_TRACE), "--json", "--by", "step").stdout)["rows"]
    assert [(r["step"], r["in_window"], r["calls"]) for r in steps] == [(4, True, 7), (5, True, 7), (6, False, 7)]
    text = cli("overlap", str(NCCL_TRACE)).stdout
    assert "14.8%" in text and "HTA's window" in text


@pytest.mark.proc
def test_overlap_agrees_with_hta_itself(tmp_path):
    pytest.importorskip("hta")
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    shutil.copy(NCCL_TRACE, tmp_path / "rank0.json.gz")
    theirs = TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    pct = float(theirs["comp_comm_overlap_pctg"][0])
    ours = json.loads(cli("overlap", str(tmp_path), "--json").stdout)["ranks"][0]
    ours_rounded = json.loads(cli("overlap", str(tmp_path), "--json", "--round-us").stdout)["ranks"][0]
    assert abs(100 * ours["overlap_ratio"] - pct) < 1.0
    assert abs(100 * ours_rounded["overlap_ratio"] - pct) < 0.01


def _events(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_a_trace_on_one_line_reads_the_same_as_kinetos_layout(tmp_path):
    from commdebug.formats.readers import load_rank

    one_line = tmp_path / "rank0.json"
    one_line.write_text(json.dumps(_events(NCCL_TRACE)))  # no newline, no indent: not Kineto's layout
    fast, whole = load_rank(NCCL_TRACE), load_rank(one_line)
    assert fast.events == whole.events
    for kind in ("comm", "compute"):
        a, b = getattr(fast.profile, kind), getattr(whole.profile, kind)
        assert (list(a.start), list(a.end), list(a.ref)) == (list(b.start), list(b.end), list(b.ref))


@pytest.mark.proc
def test_an_older_trace_without_collective_args_reads_its_annotations(tmp_path):
    from commdebug.formats.readers import load_rank

    data = _events(NCCL_TRACE)
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") != "record_param_comms"]
    for e in data["traceEvents"]:
        if e.get("cat") == "kernel":
            for key in ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
                        "Process Group Description", "Process Group Ranks", "In split size", "Out split size"):
                e["args"].pop(key, None)
    old = tmp_path / "rank0.json.gz"
    old.write_bytes(gzip.compress(json.dumps(data, indent=1).encode()))
    view = load_rank(old)
    assert Counter(e.op for e in view.events) == {"all_reduce": 15, "broadcast": 6}
    assert {e.group.label for e in view.events} == {"default_pg[2]"}  # distributedInfo's one group
    assert all(e.size_bytes is None for e in view.events)  # not known: never 0
    assert any("unknown size" in n for n in view.notes) and any("no record_param_comms" in n for n in view.notes)
    assert all(e.latency_s for e in view.events)  # kernels still tied to their calls, by launch
    assert abs(100 * json.loads(cli("overlap", str(old), "--json").stdout)["ranks"][0]["overlap_ratio"] - HTA_PCT) < 1.0


# ---- a gloo job's own torch.profiler traces -----------------------------------------------------

@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 120)
def test_a_gloo_jobs_own_traces_are_its_calls_and_its_overlap(tmp_path):
    _ranks([sys.executable, str(PROFILED), str(tmp_path), "--gz"], tmp_path, done="profiled job done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    summary = json.loads(cli("summary", str(tmp_path), "--json").stdout)
    calls = {r["op"]: r["calls"] for r in summary["rows"]}  # 3 profiled steps x 2 ranks
    assert calls == {"all_reduce": 18, "all_gather": 6, "all_to_all": 6, "broadcast": 6, "barrier": 6, "send": 3, "recv": 3}
    sizes = {r["op"]: r["bytes"] for r in summary["rows"]}
    assert sizes["all_gather"] == 6 * 800 and sizes["all_to_all"] == 6 * 16  # from the recorded shapes
    result = json.loads(cli("overlap", str(tmp_path), "--json").stdout)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for rank in result["ranks"]:
        assert rank["device"] == "cpu" and rank["comm_s"] > 0 and rank["compute_s"] > 0
        mine = [r for r in result["rows"] if r["rank"] == rank["rank"]]
        assert "all_reduce" in {r["op"] for r in mine} and "?" not in {r["op"] for r in mine}  # every gloo span tied
        assert abs(sum(r["exposed_s"] for r in mine) - rank["exposed_s"]) < 1e-9
    module = cli("overlap", str(tmp_path), "--by", "module")
    assert module.returncode == 2 and "needs each profile joined to its rank's commdebug dump" in module.stderr


# ---- commdebug run --profile-steps ---------------------------------------------------------------

def _profiled_run(out: Path, mode: str) -> None:
    """Tutorial 13's model in `mode` on two gloo ranks under `commdebug run --profile-steps 1-3`, 4 steps."""
    cmd = [sys.executable, "-m", "commdebug", "run", "--out", str(out), "--profile-steps", "1-3", "--",
           str(OVERLAP), "--mode", mode, "--steps", "4"]
    _ranks(cmd, out.parent)
    assert sorted(p.name for p in out.glob("rank*.profile.json.gz")) == ["rank0.profile.json.gz", "rank1.profile.json.gz"]


def async_profiled(shared_run) -> Path:
    """The async run's folder, made once per test run and read-only: the overlap chart's browser
    tests (tests/browser/test_overlap_chart.py) read the same job."""
    return shared_run.folder("overlap-async", lambda out: _profiled_run(out / "traces", "async")) / "traces"


def _by_module(folder: Path) -> dict:
    return json.loads(cli("overlap", str(folder), "--json", "--by", "module").stdout)


@pytest.mark.proc
@pytest.mark.timeout(2 * DEADLINE_S + 120)
def test_profile_steps_tell_overlapped_from_blocking_communication_per_module(tmp_path, shared_run):
    _profiled_run(tmp_path / "blocking", "blocking")
    blocking = _by_module(tmp_path / "blocking")
    overlapped = _by_module(async_profiled(shared_run))
    for result in (blocking, overlapped):
        for rank in result["ranks"]:
            assert rank["joined"] and rank["steps"] == [1, 2, 3]
            mine = [r for r in result["rows"] if r["rank"] == rank["rank"]]
            assert {r["module"] for r in mine} == {"Sequential.0", "Sequential.1", "Sequential.2"}
            assert all(r["calls"] == 2 for r in mine)  # one all_reduce per layer in steps 1-2 (step 3 is outside the window)
            assert abs(sum(r["exposed_s"] for r in mine) - rank["exposed_s"]) < 1e-9
    # a blocking all_reduce has nothing under it; one issued before an independent branch does
    assert all(r["overlap_ratio"] < 0.05 for r in blocking["ranks"])
    assert max(r["overlap_ratio"] for r in overlapped["ranks"]) > 0.15
    assert sum(r["overlap_s"] for r in overlapped["ranks"]) > 5 * sum(r["overlap_s"] for r in blocking["ranks"]) + 1e-6
    report = json.loads(cli("report", str(async_profiled(shared_run)), "--json").stdout)
    assert report["ranks"][0]["timed"] == 9  # the profiled steps' calls, timed by the profile
    # the rank counts once, though its folder holds its dump and its profile
    assert len(json.loads(cli("check", str(async_profiled(shared_run)), "--json").stdout)["rank_summaries"]) == 2


def test_profile_steps_of_a_fake_world_name_commdebugs_steps_and_say_what_they_cannot(world, tmp_path):
    import torch
    import torch.distributed as dist

    from commdebug.formats.readers import load_rank
    from commdebug.launch.session import RecordingSession

    def program(steps: int) -> None:
        for _ in range(steps):
            t = torch.ones(64)
            dist.all_reduce(t)
            session.mode.step()

    session = RecordingSession(tmp_path / "a", profile_steps="1-2", html=False)
    session.start()
    program(4)
    session.finish()
    view = load_rank(tmp_path / "a" / "rank0.json")
    assert [s.number for s in view.profile.steps] == [1, 2]  # ProfilerStep#N is commdebug's step N
    assert view.metadata["profile_steps"] == [1, 2] and view.metadata["profile"] == "written"
    assert [view.events[j].step for j in view.profile.joined] == [1, 2]  # joined to the dump's calls of those steps

    session = RecordingSession(tmp_path / "b", profile_steps="5-6", html=False)
    session.start()
    program(2)
    session.finish()
    assert not (tmp_path / "b" / "rank0.profile.json.gz").exists()
    assert load_rank(tmp_path / "b" / "rank0.json").metadata["profile"].startswith("skipped: the program ended before step 5")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):  # the program's own profiler: only one can run
        session = RecordingSession(tmp_path / "c", profile_steps="0-1", html=False)
        session.start()
        program(2)
        session.finish()
    assert load_rank(tmp_path / "c" / "rank0.json").metadata["profile"] == "skipped: the program runs its own profiler"

    session = RecordingSession(tmp_path / "d", profile_steps="1", timing="sync", html=False)
    session.start()
    program(3)
    session.finish()
    view = load_rank(tmp_path / "d" / "rank0.json")
    assert [view.events[j].step for j in view.profile.joined] == [1]
    assert any("under --timing sync" in n and "not the program's own" in n for n in view.notes)

    session = RecordingSession(tmp_path / "e", profile_steps="1-2", end_step=2, html=False)
    session.start()
    program(4)
    session.finish()
    view = load_rank(tmp_path / "e" / "rank0.json")
    assert view.profile.joined == [-1] * len(view.profile.calls)
    assert any("not joined to the dump" in n and "--end-step 2" in n for n in view.notes)


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.proc
def test_bad_traces_get_one_line_and_exit_2(tmp_path):
    raw = gzip.decompress(NCCL_TRACE.read_bytes())
    cut = tmp_path / "cut" / "rank0.pt.trace.json"
    cut.parent.mkdir()
    cut.write_bytes(raw[: len(raw) // 2])
    done = cli("overlap", str(cut))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "rank0.pt.trace.json" in done.stderr
    assert "Traceback" not in done.stderr
    gz = tmp_path / "gz" / "rank0.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(NCCL_TRACE.read_bytes()[:200_000])
    done = cli("overlap", str(gz))
    assert done.returncode == 2 and "not a complete gzip file" in done.stderr
    nameless = tmp_path / "nameless" / "host_123.1700000000000.pt.trace.json"
    nameless.parent.mkdir()
    data = json.loads(raw)
    del data["distributedInfo"]
    nameless.write_text(json.dumps(data, indent=1))
    done = cli("overlap", str(nameless.parent))
    assert done.returncode == 2 and "names no rank" in done.stderr
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(NCCL_TRACE, two / "rank0.pt.trace.json.gz")
    shutil.copy(NCCL_TRACE, two / "job-b.pt.trace.json.gz")  # its distributedInfo says rank 0 too
    for verb in ("overlap", "check", "report"):
        done = cli(verb, str(two))
        assert done.returncode == 2 and "all claim rank 0" in done.stderr, (verb, done.stderr)
    sizes = tmp_path / "sizes"
    sizes.mkdir()
    shutil.copy(NCCL_TRACE, sizes / "rank0.pt.trace.json.gz")
    other = json.loads(raw)
    other["distributedInfo"].update(rank=1, world_size=4)  # rank 1 of another, larger job
    (sizes / "rank1.pt.trace.json").write_text(json.dumps(other, indent=1))
    done = cli("overlap", str(sizes))
    assert done.returncode == 2 and "jobs of different world sizes" in done.stderr, done.stderr


@pytest.mark.proc
def test_a_trace_without_collectives_says_so_and_exits_0(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    path = tmp_path / "rank0.pt.trace.json"
    prof.export_chrome_trace(str(path))
    done = cli("overlap", str(path))
    assert done.returncode == 0, done.stderr
    assert "no collectives" in done.stdout


# ---- synthetic NCCL jobs: many ranks, groups, "Seq", all_to_all splits -----------------------------

def _synthetic_job(folder: Path, world: int, bad: tuple[int, int] | None = None) -> None:
    """`world` ranks, named as torch names traces (no rank in the name: distributedInfo says it):
    per step an all_reduce on each rank's tensor-parallel pair and an uneven all_to_all on the
    world (rank r sends (r + j) % 3 + 1 rows to j), each kernel half under a compute kernel.
    `bad` = (receiver, sender): the receiver expects one row more from the sender than it sends."""
    from kineto_synth import Call, write_trace

    groups = {"0": ("default_pg", list(range(world)))}
    for k in range(world // 2):
        groups[str(k + 1)] = ("mesh_tp", [2 * k, 2 * k + 1])
    steps = [(1, 0.0, 1000.0), (2, 1000.0, 2000.0), (3, 2000.0, 2500.0)]
    for rank in range(world):
        calls, compute = [], []
        pair = str(rank // 2 + 1)
        for i, (number, start, _) in enumerate(steps):
            recv = [(j + rank) % 3 + 1 for j in range(world)]
            if bad is not None and rank == bad[0] and number == 2:
                recv[bad[1]] += 1
            send = [(rank + j) % 3 + 1 for j in range(world)]
            calls.append(Call("allreduce", pair, cpu=(start + 100, 40), kernel=(start + 200, 100), nelems=4096, seq=i + 1))
            calls.append(Call("all_to_all", "0", cpu=(start + 400, 40), kernel=(start + 500, 100), nelems=sum(send) * 8,
                              out_nelems=sum(recv) * 8, in_splits=send, out_splits=recv, seq=i + 1))
            compute += [(start + 250, 100), (start + 550, 100)]  # each kernel's second half under compute
        write_trace(folder / f"host_{1000 + rank}.17000000{rank:05d}.pt.trace.json.gz", rank, world, groups, steps, calls, compute)


@pytest.mark.proc
@pytest.mark.parametrize("world", [16, 128])
def test_synthetic_nccl_jobs_read_check_and_measure_every_rank(tmp_path, world):
    _synthetic_job(tmp_path, world)
    check = json.loads(cli("check", str(tmp_path), "--json").stdout)
    assert check["consistent"], check["findings"][:2]
    assert (check["ranks"], check["groups"], check["collectives_per_rank"]) == (world, world // 2 + 1, {"min": 6, "max": 6})
    result = json.loads(cli("overlap", str(tmp_path), "--json", "--by", "group").stdout)
    assert [r["rank"] for r in result["ranks"]] == list(range(world))
    for rank in result["ranks"]:  # steps 1-2 (the last left out): 4 kernels of 100 us, each half under compute
        assert rank["calls"] == 4 and abs(rank["comm_s"] - 400e-6) < 1e-9 and abs(rank["overlap_ratio"] - 0.5) < 1e-9
    labels = {r["group"] for r in result["rows"] if r["rank"] == 3}
    assert labels == {f"default_pg[{world}]", "mesh_tp[2]"}
    peers = json.loads(cli("summary", str(tmp_path), "--by", "peer", "--json").stdout)
    pair = next(r for r in peers["rows"] if r["src"] == 2 and r["dst"] == 3)
    assert pair["bytes"] == 3 * ((2 + 3) % 3 + 1) * 8 * 4  # 3 steps x rows x 8 elements x 4 bytes


@pytest.mark.proc
def test_a_split_bug_in_a_synthetic_nccl_job_is_named_pair_by_pair(tmp_path):
    _synthetic_job(tmp_path, 16, bad=(5, 6))
    done = cli("check", str(tmp_path))
    assert done.returncode == 1, done.stdout
    assert "rank 6 sends" in done.stdout and "but rank 5 receives" in done.stdout and "(step 2)" in done.stdout


def test_launches_written_in_another_layout_are_found_all_the_same(tmp_path):
    from commdebug.formats.readers import load_rank

    _synthetic_job(tmp_path, 2)
    kineto = sorted(tmp_path.glob("*.gz"))[0]
    text = gzip.decompress(kineto.read_bytes()).decode()
    other = tmp_path / "other" / "rank0.json"
    other.parent.mkdir()
    other.write_text(text.replace('"cbid": 211, "correlation"', '"cbid":211,"correlation"'))  # no longer Kineto's spacing
    a, b = load_rank(kineto).profile, load_rank(other).profile
    assert list(a.comm.launch) == list(b.comm.launch) and list(a.compute.launch) == list(b.compute.launch)
    assert not any(math.isnan(t) for t in b.compute.launch)


@pytest.mark.proc
@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_late_ranks_gap_lists_what_its_profile_ran(tmp_path):
    """Rank 1 multiplies matrices for 0.8 s before step 2's all_reduce (issue 39's gap_top): with
    the steps profiled, report's late rank says what it ran in its gap. Its own job: the late
    job's compute variant, profiled, which no other test reads (test_late_ranks' job sleeps)."""
    cmd = [sys.executable, "-m", "commdebug", "run", "--out", str(tmp_path / "traces"), "--timing", "--profile-steps", "1-3",
           "--", str(ROOT / "tests" / "programs" / "late_job.py")]
    port = free_port()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LATE_RANK": "1", "LATE_HOW": "compute"})
             for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=DEADLINE_S)
        assert p.returncode == 0, err[-3000:]
    late = json.loads(cli("report", str(tmp_path / "traces"), "--json").stdout)["late_ranks"]
    assert (late[0]["rank"], late[0]["step"]) == (1, 2)
    names = [o["name"] for o in late[0]["gap_top"]]
    assert "aten::mm" in names, late[0]["gap_top"]
    mm = next(o for o in late[0]["gap_top"] if o["name"] == "aten::mm")
    assert mm["count"] > 10 and 0 < mm["total_s"] < late[0]["gap_s"]
    text = cli("report", str(tmp_path / "traces")).stdout
    assert "in that gap it ran: aten::mm" in text


@pytest.mark.proc
def test_a_late_gpus_gap_lists_the_kernels_it_launched_there_with_their_whole_gpu_time():
    """Recorded on an H100 (tests/data/late_h100/README.md): rank 3 queued 0.88 s of matrix
    products in an 81 ms host gap. Counting only the kernels that ran inside the host gap said
    80 ms (x55), a tenth of the wait; the kernels it launched there account for all of it."""
    folder = ROOT / "tests" / "data" / "late_h100"
    late = json.loads(cli("report", str(folder), "--json").stdout)["late_ranks"]
    first = late[0]
    assert (first["rank"], first["step"], first["op"], first["waited"]) == (3, 2, "all_reduce", 3)
    assert 0.07 < first["gap_s"] < 0.1 and first["others_gap_s"] < 0.01
    top = first["gap_top"][0]
    assert top["name"].startswith("nvjet_") and top["on"] == "gpu" and top["count"] == 565, first["gap_top"]
    assert 0.85 < top["total_s"] < 0.9 and abs(top["total_s"] - first["max_wait_s"]) < 0.05 * first["max_wait_s"]
    text = cli("report", str(folder)).stdout
    assert "    in that gap it launched on the GPU: nvjet_" in text and " 879 ms (x565)" in text, text
    # gloo on CUDA tensors: no communication kernel, so the profile times none of the calls
    assert "steps 1-3: the profile holds no communication kernel or backend span of its 6 collectives" in cli("check", str(folder)).stdout


@pytest.mark.proc
def test_check_gives_no_verdict_on_traces_whose_calls_name_no_group(tmp_path):
    """A gloo job's own traces name no process group: check cannot pair a call across ranks, and
    says so (exit 2) rather than calling the job consistent."""
    from kineto_synth import Call, write_trace

    for rank in range(2):  # an NCCL-vintage trace without group args, two groups in distributedInfo
        text_calls = [Call("allreduce", "0", cpu=(100, 10), kernel=(120, 50))]
        path = write_trace(tmp_path / f"rank{rank}.pt.trace.json", rank, 2, {"0": ("default_pg", [0, 1]), "1": ("pair", [0, 1])},
                           [(1, 0.0, 500.0)], text_calls)
        data = json.loads(path.read_text())
        for e in data["traceEvents"]:
            if e.get("name") == "record_param_comms":  # an older trace: only the annotation
                e["name"], e["cat"], e["args"] = "nccl:all_reduce", "user_annotation", {"External id": e["args"]["External id"]}
        path.write_text(json.dumps(data, indent=1))
    done = cli("check", str(tmp_path))
    assert done.returncode == 2 and "nothing to check: the ranks' collectives name no process group" in done.stderr
    assert done.stdout == ""
