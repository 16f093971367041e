"""Compiled code is known by where it comes from, not by a path: with Inductor's cache in a
folder of one's own (``TORCHINDUCTOR_CACHE_DIR``, any name), every collective compiled code
issues is marked compiled, and its source line is the user's line that called the compiled
block (forward) or ran the backward, as eager names the user's line, never Inductor's generated
file nor the compiled function's ``def`` line. Full and light capture, the C source walk and the
Python one.

Inductor reads its cache folder once per process: the program runs in a subprocess (about
20-40 s on a 2-core CPU, nearly all of it the compile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.proc  # every test here starts a process (tests/conftest.py)

PROGRAM = textwrap.dedent('''
    import json

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from commdebug import CommDebugMode
    from commdebug.capture import source


    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(8, 16)
            self.down = nn.Linear(16, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = MLP()
            self.b = MLP()

        def forward(self, x):
            x = self.a(x)  # CALLS a
            return self.b(x)  # CALLS b


    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    mesh = init_device_mesh("cpu", (4,))
    net = Net()
    for block in (net.a, net.b):
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    net.a.compile(fullgraph=True)  # both ways of compiling a block
    net.b = torch.compile(net.b, fullgraph=True)
    x = torch.randn(4, 8, requires_grad=True)


    def step():
        net(x).sum().backward()  # BACKWARD


    step()  # compiled here, outside the recordings
    C_WALK = source._first_other
    found = []
    for capture in ("full", "light"):
        for walk in ("C", "Python"):
            if walk == "C" and C_WALK is None:
                continue
            source._first_other = C_WALK if walk == "C" else None
            with CommDebugMode(light=capture == "light") as comm:
                step()
            found += [[capture, walk, e.op, e.phase, e.module, e.compiled, e.source] for e in comm.trace.events]
    print("EVENTS " + json.dumps(found))
''')


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(PROGRAM.splitlines(), 1) if text.endswith(f"# {marker}"))


def test_compiled_collectives_are_known_by_origin_with_a_cache_folder_of_ones_own(tmp_path):
    cache = tmp_path / "my_cache"  # no "torchinductor" anywhere in its path
    assert "torchinductor" not in str(cache)
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(cache.rglob("*.py")), "Inductor wrote no code to the cache folder"
    events = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("EVENTS "))[7:])

    here = str(program)
    expected = {
        ("forward", "Net.a"): f"{here}:{_line('CALLS a')}",
        ("forward", "Net.b"): f"{here}:{_line('CALLS b')}",
        ("backward", "Net.a"): f"{here}:{_line('BACKWARD')}",
        ("backward", "Net.b"): f"{here}:{_line('BACKWARD')}",
    }
    runs = {(capture, walk) for capture, walk, *_ in events}
    assert {capture for capture, _ in runs} == {"full", "light"}
    if sys.version_info[:2] == (3, 11):  # commdebug.capture._frames reads 3.11's frames only
        assert {walk for _, walk in runs} == {"C", "Python"}, "commdebug.capture._frames was not built"
    for run in runs:
        mine = [e for e in events if tuple(e[:2]) == run]
        # each block: one all_reduce forward, one backward
        assert sorted((phase, module) for _, _, _, phase, module, _, _ in mine) == sorted(expected), run
        for _, _, op, phase, module, compiled, line in mine:
            assert compiled, (run, op, phase, module, line)
            assert line == expected[(phase, module)], (run, phase, module, line)
