"""Folders read in parallel worker processes (``-j N``) give exactly what one process gives, and
the workers never import torch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commdebug.formats.readers import default_jobs, job_files, parse_json

from synthetic import write_rank_dumps

ROOT = Path(__file__).resolve().parents[1]
RANKS = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """16 ranks of a 2-layer TP transformer, 2 steps, each rank's times its own, rank 9 issuing
    one call twice as large (a finding to report)."""
    root = tmp_path_factory.mktemp("parallel") / "traces"
    write_rank_dumps(root, ranks=RANKS, layers=2, steps=2, odd_rank=9, odd_module="Transformer.layers.1.attention.wo")
    return root


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # this checkout's commdebug, from any working directory
    return subprocess.run([sys.executable, "-m", "commdebug", *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=180)


@pytest.mark.proc
@pytest.mark.parametrize("verb", [["check"], ["check", "--json"], ["report", "--json"], ["report", "--steps", "1"],
                                  ["report", "--ranks", "0-7,12", "--top", "0"], ["summary"], ["summary", "--json", "--by", "module"]])
def test_j1_and_j2_print_the_same(folder, verb):
    one, two = (cli(*verb, str(folder), "-q", "-j", j, cwd=folder.parent) for j in ("1", "2"))
    assert one.returncode == two.returncode and one.returncode in (0, 1), one.stderr + two.stderr
    assert one.stdout and one.stdout == two.stdout
    assert "rank 9" in one.stdout or '"rank": 9' in one.stdout or "9" in one.stdout


@pytest.mark.proc
@pytest.mark.parametrize("options", [[], ["--ranks", "0-7,12", "--steps", "1"]])
def test_j1_and_j2_write_the_same_trace(folder, options):
    """Each rank's events are written by the worker that read it (a RankChunk): the same bytes."""
    outs = []
    for j in ("1", "2"):
        out = folder.parent / f"trace{j}.json"
        proc = cli("trace", str(folder), "-q", "-j", j, "-o", str(out), *options, cwd=folder.parent)
        assert proc.returncode == 0, proc.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    events = json.loads(outs[0])["traceEvents"]
    assert len({e["pid"] for e in events if e.get("ph") == "X"}) == (9 if options else RANKS)
    assert any(e.get("ph") == "f" for e in events)  # flows joined across ranks read by different workers


@pytest.mark.proc
def test_view_data_is_the_same_with_two_workers(folder):
    from commdebug.analysis.rank_modules import rank_modules

    one, two = rank_modules(folder, jobs=1), rank_modules(folder, jobs=2)
    assert len(one.ranks) == RANKS and [r.rank for r in two.ranks] == list(range(RANKS))
    assert dataclasses.asdict(one) == dataclasses.asdict(two)


@pytest.mark.proc
def test_workers_import_no_torch(folder):
    """Every process (the reader and its two spawned workers) reports its imports on stderr
    (-X importtime is passed on to spawned children): none is torch."""
    code = ("import sys; from commdebug.formats.readers import read_all, job_files\n"
            f"views = [v for _, v in read_all(job_files({str(folder)!r}), jobs=2)]\n"
            f"assert [v.rank for v in views] == list(range({RANKS})), [v.rank for v in views]\n"
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imported.count("commdebug.formats.readers") == 3  # the reader and both workers
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


@pytest.mark.proc
def test_a_bad_file_is_named_in_order_with_workers(folder, tmp_path):
    from commdebug.formats.readers import read_all

    bad = tmp_path / "traces"
    bad.mkdir()
    for f in job_files(folder)[:4]:
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "rank2.json").write_text("{not json")
    results = list(read_all(job_files(bad), jobs=2))
    assert [p.name for p, _ in results] == ["rank0.json", "rank1.json", "rank2.json", "rank3.json"]
    assert "rank2.json: not valid JSON (line 1, column 2" in str(results[2][1])
    proc = cli("check", str(bad), "-j", "2", cwd=tmp_path)
    assert proc.returncode == 2 and "rank2.json: not valid JSON" in proc.stderr and proc.stderr.count("\n") == 1


def test_default_jobs_is_one_for_a_small_folder(folder):
    assert default_jobs(job_files(folder)) == 1  # a few MB: starting workers would cost more


def test_json_parsers_agree_and_nan_still_reads(tmp_path):
    """orjson (when installed) and the standard library give the same data; what orjson refuses
    (NaN, which json.dumps writes for a NaN latency) falls back to the standard library."""
    raw = b'{"a": [1, 2.5, null, "x\\u00e9"], "b": {"c": NaN}}'
    data = parse_json(raw, tmp_path / "x.json")
    assert data["a"] == [1, 2.5, None, "x\u00e9"] and data["b"]["c"] != data["b"]["c"]
    raw = json.dumps({"columns": {"latency_s": [1e-4, 3.5e-05], "op": [0, 1]}, "strings": ["all_reduce", "é"]}).encode()
    assert parse_json(raw, "x") == json.loads(raw)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """16 ranks derived from one real fake-backend run (bench/ranks_scale.py's builder): rank 11
    slow on the last two steps, rank 6 missing an all_reduce in the last step."""
    from ranks_job import write_job

    return write_job(tmp_path_factory.mktemp("planted") / "job", 16)


@pytest.mark.proc
@pytest.mark.parametrize("which", ["folder", "planted"])
def test_digests_from_workers_give_what_the_views_give(which, request):
    """check and report from digests made in two worker processes equal check and report of
    the views read here (the analysis they replace)."""
    from commdebug.analysis import check as check_mod, report as report_mod
    from commdebug.formats.readers import iter_ranks

    root = request.getfixturevalue(which)
    root = getattr(root, "folder", root)
    views = list(iter_ranks(root, jobs=1))
    for mod in (check_mod, report_mod):
        analyse = mod.check if mod is check_mod else mod.report
        here = analyse(views).to_dict()
        digests = list(iter_ranks(root, jobs=2, digest=mod.rank_digest))
        assert all(isinstance(d, mod.RankDigest) for d in digests) and [d.rank if mod is check_mod else d.stats.rank
                                                                        for d in digests] == list(range(len(views)))
        assert analyse(digests).to_dict() == here


@pytest.mark.proc
def test_planted_faults_are_found_the_same_with_any_j(planted):
    outs = [cli(verb, str(planted.folder), "-q", "-j", j, "--json", cwd=planted.folder.parent) for verb in ("check", "report")
            for j in ("1", "2")]
    assert outs[0].stdout == outs[1].stdout and outs[2].stdout == outs[3].stdout
    check, report = json.loads(outs[0].stdout), json.loads(outs[2].stdout)
    assert not check["consistent"] and any([planted.skip] in [s["ranks"] for s in f["sides"]] for f in check["findings"])
    slow = next(r for r in report["ranks"] if r["rank"] == planted.slow)
    assert sorted(w["step"] for w in slow["worst_steps"][:2]) == sorted(planted.slow_steps)
    skip = next(r for r in report["ranks"] if r["rank"] == planted.skip)
    assert skip["collectives"] == min(r["collectives"] for r in report["ranks"]) == planted.events - 1


def _die(view):
    """A digest that kills the worker running it, as the kernel's OOM killer would."""
    import os

    os._exit(9)


@pytest.mark.proc
def test_a_worker_that_dies_is_one_clear_error_not_a_traceback(folder):
    from commdebug.errors import DumpError
    from commdebug.formats.readers import read_all

    with pytest.raises(DumpError, match=r"a worker process reading the folder died .*-j 1"):
        list(read_all(job_files(folder), jobs=2, digest=_die))
