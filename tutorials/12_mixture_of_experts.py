"""Tutorial 12: a Mixture-of-Experts layer with expert parallelism: who sends how much to whom,
how unevenly the router spreads the tokens, and a split bookkeeping bug caught before it hangs.

Run it:  python tutorials/12_mixture_of_experts.py
It runs programs/12_moe.py (top-2 routing over 4 experts, 2 per rank; counts exchanged first,
then the tokens dispatched and combined with all_to_all_single) on two gloo ranks under torchrun,
once with a balanced router and once with a skewed one; then `commdebug check`, `summary --by
peer` and `report` on both; then the same layer with a planted split bug on two ranks of torch's
fake backend, where `commdebug check` names the pair.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tutorials" / "programs" / "12_moe.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(*args, cwd, ok=(0,)):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=180)
    if proc.returncode not in ok:
        sys.exit(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def clean(text):
    """Paths as the page shows them: the program relative to tutorials/."""
    return text.replace(str(PROGRAM.parent.parent) + os.sep, "")


def commdebug(*args, cwd, ok=(0,)):
    print(f"$ commdebug {' '.join(args)}")
    proc = run("-m", "commdebug", *args, cwd=cwd, ok=ok)
    print(clean(proc.stdout), end="")
    return proc


with tempfile.TemporaryDirectory() as tmp:
    for router in ("balanced", "skewed"):
        print(f"===== {router} router: 2 gloo ranks =====")
        print(f"$ torchrun --standalone --nproc-per-node=2 programs/12_moe.py {router} --router {router}")
        job = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(PROGRAM), router,
                  "--router", router, cwd=tmp)
        print("\n".join(sorted(line for line in job.stdout.splitlines() if line.startswith("routed "))))
        commdebug("check", router, cwd=tmp)

    print("===== who sent how much to whom =====")
    for router in ("balanced", "skewed"):
        commdebug("summary", router, "--by", "peer", cwd=tmp)

    print("===== how unevenly the tokens landed, per step =====")
    for router in ("balanced", "skewed"):
        print(f"$ commdebug report {router}    (its all_to_all section)")
        text = run("-m", "commdebug", "report", router, cwd=tmp).stdout
        print(text[text.index("all_to_all imbalance"):].split("\n\n")[0])  # the section, up to the next one

    print("===== one rank's dump alone =====")
    print("$ commdebug report skewed/rank1.json    (its all_to_all section)")
    text = run("-m", "commdebug", "report", "skewed/rank1.json", cwd=tmp).stdout
    print(text[text.index("all_to_all received"):].split("\n\n")[0])

    print("===== a planted split bug: 2 ranks of the fake backend =====")
    print("$ python programs/12_moe.py bug --router skewed --fake RANK 2 --bug    (RANK 0 and 1)")
    Path(tmp, "bug").mkdir()
    procs = [subprocess.Popen([sys.executable, str(PROGRAM), "bug", "--router", "skewed", "--fake", str(r), "2", "--bug"],
                              cwd=tmp, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        if p.returncode != 0:
            sys.exit(f"the fake-backend rank failed ({p.returncode}):\n{out}\n{err}")
    done = commdebug("check", "bug", cwd=tmp, ok=(1,))
    print(f"exit status {done.returncode}")
