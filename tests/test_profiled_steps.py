"""A real FSDP2 run profiled on some of its steps (tests/data/fsdp_profiled: rank 0 of two gloo
ranks of tests/programs/fsdp_job.py, 4 steps, recorded with `commdebug run --profile-steps 1-2`
and no --timing; paths cut to the checkout, host renamed): a share is over the time its
numerator covers, the profiled steps', in summary and report alike; and the profile read alone
gives each call the phase the dump gives it (FSDP2's last reduce_scatter runs in
root_post_backward_callback, outside the autograd engine's spans)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from commdebug.formats.readers import load_rank, read_profile_file

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "fsdp_profiled"


@pytest.fixture
def cli(in_process_cli):
    return in_process_cli  # commdebug ARGS in this process (tests/conftest.py)


@pytest.fixture(scope="module")
def profiled_s() -> float:
    """The profiled steps' summed time, from the profile's ProfilerStep spans."""
    profile = read_profile_file(DATA / "rank0.profile.json.gz")
    assert [s.number for s in profile.steps] == [1, 2]
    return sum(s.end - s.start for s in profile.steps) / 1e6


def test_a_share_is_over_the_profiled_steps_time_in_summary_and_report(profiled_s, cli):
    header = json.loads(cli("summary", str(DATA / "rank0.json"), "--json").stdout)["header"]
    assert header["timed_steps"] == [2, 4] and header["share_time_s"] == pytest.approx(profiled_s)
    assert header["comm_share"] == pytest.approx(header["comm_time_s"] / profiled_s)
    assert header["share_time_s"] < header["recorded_s"] / 1.5  # not all four steps' time
    text = cli("summary", str(DATA / "rank0.json")).stdout
    assert f"({header['comm_share'] * 100:.1f}% of the time of the 2 timed steps, of 4)" in text, text
    report = json.loads(cli("report", str(DATA), "--json").stdout)
    assert report["ranks"][0]["share"] == pytest.approx(header["comm_share"])  # one share for the same calls
    assert "rank 0: calls timed in 2 of 4 steps: the share is over those steps' time" in report["notes"]


def test_a_profile_read_alone_gives_each_call_the_phase_its_dump_gives(tmp_path):
    dump = load_rank(DATA / "rank0.json")
    joined = Counter((e.op, e.phase) for e in dump.events if e.step in (1, 2))
    alone = tmp_path / "rank0.pt.trace.json.gz"
    shutil.copy(DATA / "rank0.profile.json.gz", alone)
    read = Counter((e.op, e.phase) for e in load_rank(alone).events)
    assert read == joined and read[("reduce_scatter", "backward")] == joined[("reduce_scatter", "backward")] > 0, (read, joined)
    assert ("reduce_scatter", "forward") not in read


def test_a_timed_recording_whose_last_step_holds_only_a_failed_call_keeps_its_share(world):
    """A rank that died in a step under --timing: that step's one call failed, untimed. Its
    share is over the recording's time, as every call it could time was timed; only a run timed
    by a profile of some steps (timing off) is over those steps."""
    import torch
    import torch.distributed as dist

    from commdebug import CommDebugMode
    from commdebug.analysis.shares import share_base

    with CommDebugMode(timing="sync") as comm:
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
            comm.step()
        dist.all_reduce(torch.ones(4))  # step 3: the call the rank died in
    events = list(comm.trace.events)
    assert [e.step for e in events] == [0, 1, 2, 3] and all(e.latency_s is not None for e in events)
    died = [*events[:-1], events[-1]._replace(latency_s=None)]
    metadata = comm.trace.metadata
    base = share_base(died, metadata)
    assert base.seconds == metadata["recorded_s"] and not base.partial
    profiled_only = share_base(died, {**metadata, "timing": "off"})
    assert profiled_only.partial and profiled_only.seconds is None  # no profile spans to be over
