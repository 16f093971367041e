"""Free TCP ports for the benches, the tests and the programs they start: the one way to find them.

Where ``TEST_PORT_RANGE`` is set (``LO-HI``, inclusive), ports are taken from that range
only. The test suite sets a range of its own for each of its parallel workers (tests/conftest.py),
below the kernel's ephemeral ports, so two workers never pick the same port between finding it
free and binding it, and no port a kernel hands out to a connection lands in a worker's range.
Elsewhere the kernel picks one.

    from ports import free_port       # bench/ on sys.path
    os.environ["MASTER_PORT"] = str(free_port())
    metrics = free_port(2)            # metrics, and metrics + 1 free too
"""

from __future__ import annotations

import os
import random
import socket

RANGE_VARIABLE = "TEST_PORT_RANGE"


def _all_free(port: int, consecutive: int) -> bool:
    try:
        for p in range(port, port + consecutive):
            with socket.socket() as s:
                s.bind(("0.0.0.0", p))
    except OSError:
        return False
    return True


def _range() -> tuple[int, int] | None:
    text = os.environ.get(RANGE_VARIABLE)
    if not text:
        return None
    lo, _, hi = text.partition("-")
    return int(lo), int(hi)


def free_port(consecutive: int = 1) -> int:
    """A free port with the next ``consecutive - 1`` free too (metrics serve on P + LOCAL_RANK)."""
    span = _range()
    for _ in range(200):
        if span is not None:
            port = random.randint(span[0], span[1] - consecutive + 1)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port + consecutive > 65535:
                continue
        if _all_free(port, consecutive):
            return port
    raise RuntimeError(f"no {consecutive} free consecutive port(s)" + (f" in {RANGE_VARIABLE}={span[0]}-{span[1]}" if span else ""))
