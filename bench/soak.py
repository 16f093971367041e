"""Soak: does recording ever change a healthy job's exit status, or leave anything behind?

Runs ``--runs`` healthy two-rank gloo jobs (a DDP loop of 3 steps with an optimizer) under
``torchrun -m commdebug run`` for every combination of ``--light``, ``--timing``,
``--hang-timeout``, ``--metrics-port`` and ``--debug-server`` (32 combinations), and counts per
combination: jobs that exited non-zero, jobs after which a process of the job was still alive
or a port of ours still listened on, and services that could not start (a port the previous job
kept). The ports are the same for every job, so a job that leaves one held fails the next.

Not run by the tests (640 jobs take about an hour on two cores): its table is in
docs/debug-server.md.

    python bench/soak.py [--runs 20] [--only debug-server,metrics-port] [--timeout 120]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import free_port

PROGRAM = """\
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""
FLAGS = ("light", "timing", "hang-timeout", "metrics-port", "debug-server")


def listening(port: int) -> bool:
    """True while a socket listens on ``port``, by the kernel's tables (IPv4 and IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if any(f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port for f in (line.split() for line in lines)):
            return True
    return False


def alive(fragment: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds ``fragment``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if fragment in cmdline and state != "Z":
            pids.append(int(pid))
    return pids


def options(combo: tuple[str, ...], debug: int, metrics: int) -> list[str]:
    out = []
    for flag in combo:
        out += {"light": ["--light"], "timing": ["--timing"], "hang-timeout": ["--hang-timeout", "30"],
                "metrics-port": ["--metrics-port", str(metrics)], "debug-server": ["--debug-server", str(debug)]}[flag]
    return out


def one_job(folder: Path, program: Path, combo: tuple[str, ...], debug: int, metrics: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "commdebug", "run",
           "--out", str(folder / "traces"), *options(combo, debug, metrics), "--", str(program)]
    try:
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=timeout, start_new_session=True)
        status, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        status, out = "timeout", str(e.stdout or "") + str(e.stderr or "")
    deadline = time.monotonic() + 10  # a process that is ending is given a moment
    while (left := alive(str(program))) and time.monotonic() < deadline:
        time.sleep(0.2)
    ports = [p for p in ((debug,) if "debug-server" in combo else ()) + ((metrics, metrics + 1) if "metrics-port" in combo else ())
             if listening(p)]
    for pid in left:  # the next job must start clean
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return {"status": status, "left": left, "ports": ports, "unserved": "cannot serve on port" in out or "no debug server" in out,
            "abort": "Fatal Python error" in out or "terminate called" in out, "tail": out[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="jobs per combination (default 20)")
    parser.add_argument("--only", default="", help="comma-separated flags every combination must include")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one job may take (default 120)")
    args = parser.parse_args()
    required = {f for f in args.only.split(",") if f}
    unknown = required - set(FLAGS)
    if unknown:
        parser.error(f"unknown flag(s) {', '.join(sorted(unknown))} (known: {', '.join(FLAGS)})")
    combos = [c for n in range(len(FLAGS) + 1) for c in itertools.combinations(FLAGS, n) if required <= set(c)]
    debug, metrics = free_port(), free_port(2)
    rows, first_failure = [], None
    with tempfile.TemporaryDirectory(prefix="commdebug-soak-") as tmp:
        folder = Path(tmp)
        program = folder / "soak_ddp.py"
        program.write_text(PROGRAM)
        started = time.monotonic()
        for i, combo in enumerate(combos):
            failures = leftovers = unserved = aborts = 0
            for _ in range(args.runs):
                r = one_job(folder, program, combo, debug, metrics, args.timeout)
                failed = r["status"] != 0
                failures += failed
                leftovers += bool(r["left"] or r["ports"])
                unserved += r["unserved"]
                aborts += r["abort"]
                if (failed or r["left"] or r["ports"]) and first_failure is None:
                    first_failure = (combo, r)
            rows.append((" ".join("--" + f for f in combo) or "(none)", args.runs, failures, leftovers, unserved, aborts))
            print(f"[{i + 1}/{len(combos)}, {time.monotonic() - started:.0f} s] {rows[-1][0]}: {failures} failed, "
                  f"{leftovers} left something, {unserved} could not serve", file=sys.stderr, flush=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'flags':<{width}}  runs  failed  leftovers  unserved  aborts")
    for name, runs, failed, left, unserved, aborts in rows:
        print(f"{name:<{width}}  {runs:>4}  {failed:>6}  {left:>9}  {unserved:>8}  {aborts:>6}")
    total = [sum(r[k] for r in rows) for k in range(1, 6)]
    print(f"{'total':<{width}}  {total[0]:>4}  {total[1]:>6}  {total[2]:>9}  {total[3]:>8}  {total[4]:>6}")
    if first_failure is not None:
        combo, r = first_failure
        print(f"\nfirst failure ({' '.join(combo) or 'no flags'}): exit {r['status']}, left {r['left']}, ports {r['ports']}\n{r['tail']}")


if __name__ == "__main__":
    main()
