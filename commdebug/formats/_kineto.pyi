# The optional C extension (_kineto.c): one pass over a torch.profiler trace's bytes, typed for the checker.
from typing import Any

def scan(raw: bytes, markers: tuple[bytes, ...], /) -> tuple[
    dict[str, Any], list[dict[str, Any]], list[Any], dict[int, tuple[float, Any]]] | None: ...
