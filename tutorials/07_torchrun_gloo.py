"""Tutorial 7: a real two-process job under torchrun + gloo, recorded with `commdebug run --timing`.

Run it:  python tutorials/07_torchrun_gloo.py
It runs programs/07_train.py unchanged on two ranks, then `commdebug report`, `summary`, `trace`
and `view` on the per-rank dumps. Timings change from run to run, so this script masks them
(every time, share and bandwidth becomes …) and the hostname (the summary leaves its header out
with --no-header); the page shows real unmasked output as an example.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tutorials" / "programs" / "07_train.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

BYTES = re.compile(r"[\d.]+ (B|KiB|MiB|GiB)( \(r\d+\))?")
COUNT = re.compile(r"\d+( \(r\d+\))?")


def run(*args, cwd):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=180)
    if proc.returncode != 0:
        sys.exit(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def masked_table(lines, host_col=None, sort_from=None):
    """Re-lay out a table of the CLI with its varying cells masked: counts and bytes stay,
    times, shares and bandwidths become …, the hostname <host>."""
    rows = []
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if host_col is not None and cells[0].isdigit():
            cells[host_col] = "<host>"
        elif host_col is not None and cells[0] in ("min", "median", "max"):
            cells.insert(host_col, "")
        out = [cells[0]]
        for c in cells[1:]:
            if not rows:  # the header
                out.append(c)
                continue
            out.append(c if (c == "<host>" or c == "" or BYTES.fullmatch(c) or COUNT.fullmatch(c) or not re.search(r"\d", c)) else "…")
        rows.append(out)
    if sort_from is not None:
        rows[sort_from:] = sorted(rows[sort_from:])
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))).rstrip() for r in rows)


with tempfile.TemporaryDirectory() as tmp:
    print("$ torchrun --standalone --nproc-per-node=2 -m commdebug run --out traces --timing -- 07_train.py --steps 3")
    job = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "commdebug", "run",
              "--out", "traces", "--timing", "--", str(PROGRAM), "--steps", "3", cwd=tmp)
    print(re.sub(r"\d+\.\d+", "…", job.stdout), end="")  # the program's own prints (its losses masked)
    print("\n".join(sorted(line for line in job.stderr.splitlines() if line.startswith("commdebug:"))))

    traces = Path(tmp, "traces")
    print("===== traces/ =====")
    for f in sorted(traces.iterdir()):
        print(f.name)
    for r in (0, 1):
        section = json.loads((traces / f"rank{r}.json").read_text())["commdebug"]
        meta, events = section["metadata"], section["events"]
        names = [events["strings"][i] for i in events["columns"]["op"]]
        timed = sum(1 for t in events["columns"]["latency_s"] if t is not None)
        ops = ", ".join(f"{op} x{names.count(op)}" for op in sorted(set(names)))
        print(f"rank{r}.json: rank {meta['rank']} of {meta['world_size']}, backend {meta['backend']}, ended_by {meta['ended_by']}, "
              f"{events['count']} events ({ops}), {timed} timed")

    print("===== commdebug report traces/ (masked) =====")
    lines = run("-m", "commdebug", "report", "traces", cwd=tmp).stdout.splitlines()
    print(lines[0])
    ranks_end = lines.index("", 2)
    print(masked_table(lines[2:ranks_end], host_col=1))
    print()
    ops_end = lines.index("", ranks_end + 1)
    print(lines[ranks_end + 1])  # the per-op table's title
    print(masked_table(lines[ranks_end + 2:ops_end], sort_from=1))

    print("===== commdebug summary traces/ --by op --no-header (masked) =====")
    lines = run("-m", "commdebug", "summary", "traces", "--by", "op", "--no-header", cwd=tmp).stdout.splitlines()
    per_rank = lines.index("")
    print(masked_table(lines[:per_rank], sort_from=1))
    print()
    print(lines[per_rank + 1])  # the per-rank table's title
    print(masked_table(lines[per_rank + 2:], sort_from=1))

    print("===== commdebug trace traces/ -o trace.json =====")
    # the host's name is this machine's: masked
    print(re.sub(r"on host \S+ ", "on host <host> ", run("-m", "commdebug", "trace", "traces", "-o", "trace.json", cwd=tmp).stdout), end="")
    trace = json.loads(Path(tmp, "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = sorted({e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"})
    print("processes:", ", ".join(re.sub(r"\(.*\)", "(<host>)", n) for n in names))
    threads = sorted({e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"})
    print("tracks:", ", ".join(threads))
    first = next(e for e in events if e.get("ph") == "X" and e.get("cat") == "collective")
    print("a collective's args:", ", ".join(sorted(first["args"])))

    print("===== commdebug view traces/ -o job.html =====")
    print(run("-m", "commdebug", "view", "traces", "-o", "job.html", cwd=tmp).stdout, end="")
    html = Path(tmp, "job.html").read_text()
    print("ranks in the page:", ", ".join(f"rank{r}.json" for r in range(2) if f'"file":"rank{r}.json"' in html))
