"""The benchmarks run and print their ratios (figures are read by people, not asserted here:
timings on shared machines are too noisy for a test)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.proc
def test_overhead_bench_prints_its_ratios():
    proc = subprocess.run(
        [sys.executable, "bench/overhead.py", "--rounds", "1", "--layers", "2"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("ours/bare", "ours/reference", "ours/minimal", "light/bare", "light-detail10/bare", "full/bare", "light-nothing/bare"):
        assert re.search(rf"^{re.escape(name)}\s+= \d+\.\d\d", proc.stdout, flags=re.M), proc.stdout
    assert re.search(r"ours-loop: .* \d+ collectives\)", proc.stdout)
    for label in ("module call (forward + backward)", "eager c10d all_reduce", "functional all_reduce + wait", "the same, caches swept between calls"):
        assert re.search(rf"^  {re.escape(label)}\s+-?\d+\.\d\d us$", proc.stdout, flags=re.M), proc.stdout


@pytest.mark.proc
def test_percall_bench_prints_each_variants_cost_per_call_beside_flight_recorders():
    proc = subprocess.run([sys.executable, "bench/percall.py", "--rounds", "2", "--calls", "10", "--swept-calls", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    number = r"-?\d+\.\d\d"
    cell = rf"\+ *{number} \[ *{number} \.\. *{number}\]"
    for label in ("bare (Flight Recorder on)", "bare, Flight Recorder off"):
        assert re.search(rf"^{re.escape(label)} +{number} \[ *{number} \.\. *{number}\] +{number} ", proc.stdout, flags=re.M), proc.stdout
    assert re.search(rf"^added: Flight Recorder +\+ *{number} +\+ *{number} +\(difference of the medians\)$", proc.stdout, flags=re.M), proc.stdout
    for name in ("light", "light, Python kernels", "light + issue log", "light + mapped issue log", "full", "torch CommDebugMode"):
        assert re.search(rf"^added: {re.escape(name)} +{cell} +{cell}$", proc.stdout, flags=re.M), (name, proc.stdout)
    # the fake process group: no worker thread, no Flight Recorder, so no second process
    proc = subprocess.run([sys.executable, "bench/percall.py", "--backend", "fake", "--rounds", "2", "--calls", "10", "--swept-calls", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fake process group" in proc.stdout and "Flight Recorder" not in proc.stdout, proc.stdout
    assert re.search(rf"^bare +{number} \[ *{number} \.\. *{number}\] +{number} ", proc.stdout, flags=re.M), proc.stdout
    assert re.search(rf"^added: light +{cell} +{cell}$", proc.stdout, flags=re.M), proc.stdout


@pytest.mark.proc
def test_memory_bench_prints_its_ratios():
    proc = subprocess.run(
        [sys.executable, "bench/memory.py", "--layers", "1", "--max-events", "50", "--steps", "30"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^ours/reference after 1 step  = \d+\.\d\d", proc.stdout, flags=re.M), proc.stdout
    assert re.search(r"^ours 30 steps / 10 steps   = \d+\.\d\d", proc.stdout, flags=re.M), proc.stdout


@pytest.mark.proc
def test_ranks_scale_bench_finds_the_planted_faults():
    proc = subprocess.run(
        [sys.executable, "bench/ranks_scale.py", "--ranks", "16", "--events", "400", "--layers", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("check", "report"):
        assert re.search(rf"^{name} *: .* events/s .* peak RSS \d+ MiB", proc.stdout, flags=re.M), proc.stdout
    assert "planted skip on rank 6: found" in proc.stdout
    assert "planted slow rank 11 (steps 6-7): ranked first outside the late rank's group, at those steps" in proc.stdout
    assert "planted late rank: none below 64 ranks; report's late ranks: none" in proc.stdout  # jitter names nobody
    assert re.search(r"^trace, every rank *: \d+\.\d MB as \.json\.gz .* written in", proc.stdout, flags=re.M), proc.stdout
    assert re.search(r"^trace --ranks 0-7 *: .*\n  wrote .*: 8 ranks", proc.stdout, flags=re.M), proc.stdout


@pytest.mark.proc
def test_compiled_overhead_bench_prints_its_ratios_and_no_added_graph():
    proc = subprocess.run(
        [sys.executable, "bench/compiled_overhead.py", "--rounds", "1", "--layers", "1", "--steps", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("full/bare", "light/bare"):
        assert re.search(rf"^{name}: eager \d+\.\d+, compiled \d+\.\d+; added per step", proc.stdout, flags=re.M), proc.stdout
    assert "graphs the recordings added to the compiled program: 0 " in proc.stdout


def _instructions_bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import instructions
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return instructions


def test_instructions_bench_reads_cachegrinds_summary_and_works_out_a_step():
    # the summary cachegrind printed for a real run on the CI machine (recorded: a run under
    # valgrind takes minutes)
    bench = _instructions_bench()
    text = (ROOT / "tests" / "data" / "cachegrind_summary.txt").read_text()
    few = bench.parse_summary(text)
    assert few == {"instructions": 14_243_743_071, "I1 misses": 103_839_245, "D1 misses": 140_780_583, "LL misses": 34_789_827}
    many = {name: value + 20 * 1000 for name, value in few.items()}
    assert bench.per_step(few, many, 20) == {name: 1000.0 for name in few}
    with pytest.raises(ValueError, match="no I1 misses, D1 misses, LL misses"):
        bench.parse_summary("==1== I   refs:      14,243,743,071\n")


@pytest.mark.proc
def test_instructions_bench_says_what_is_missing_without_valgrind(tmp_path):
    # only python on the PATH: the bench must say what to install, not fail in a subprocess
    (tmp_path / "python").symlink_to(sys.executable)
    proc = subprocess.run([str(tmp_path / "python"), "bench/instructions.py"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={"PATH": str(tmp_path)})
    assert proc.returncode == 1
    assert "valgrind is not on the PATH" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "bench/instructions.py", "--variants", "light"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and "bare first" in proc.stderr


@pytest.mark.proc
def test_overlap_bench_prints_htas_figure_beside_ours_and_both_ratios():
    pytest.importorskip("hta")
    trace = ROOT / "tests" / "data" / "kineto" / "nccl_data.json.gz"
    proc = subprocess.run([sys.executable, "bench/overlap_vs_hta.py", str(trace), "--rounds", "1"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"^rank 0: HTA (\d+\.\d\d)%   commdebug (\d+\.\d\d)% \(--round-us (\d+\.\d\d)%\)", proc.stdout, flags=re.M)
    assert m, proc.stdout
    assert m.group(1) == m.group(3) == "14.31" and abs(float(m.group(2)) - 14.31) < 1.0
    # whole processes, both sides: the interpreter's start and the imports are in the times
    m = re.search(r"^whole process, best of 1: HTA (\d+\.\d+) s \((\d+\.\d+) s of CPU\), commdebug (\d+\.\d+) s", proc.stdout, flags=re.M)
    assert m and float(m.group(3)) > 0.01, proc.stdout
    for name in ("HTA/commdebug time", "HTA/commdebug CPU", "HTA/commdebug memory"):
        assert re.search(rf"^{re.escape(name)} *= \d+\.\dx$", proc.stdout, flags=re.M), proc.stdout
    assert re.search(r"^least HTA/commdebug time over 1 trace = \d+\.\dx$", proc.stdout, flags=re.M), proc.stdout
