# The optional C extension (_frames.c): its one function, typed for the checker.
from types import CodeType

def first_other(depth: int, files: set[str] | frozenset[str], /) -> tuple[CodeType, int, int] | None: ...
