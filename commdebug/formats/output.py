"""Output in a container format: a trace written gzip-compressed when its name ends in ``.gz``
(Perfetto and chrome://tracing open ``trace.json.gz`` as it is), through the same atomic writer
as every other file (:func:`commdebug.fileio.open_atomic`).

>>> write_text_or_gzip("trace.json.gz", ChromeTrace().render(views))   # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable
from pathlib import Path

from commdebug.fileio import open_atomic, write_output

__all__ = ["write_text_or_gzip"]


def write_text_or_gzip(path: str | os.PathLike, chunks: Iterable[str]) -> Path:
    """Write text chunks to `path` atomically: gzip-compressed when its name ends in ``.gz``,
    else as :func:`commdebug.fileio.write_output` does. Returns the resolved path."""
    if Path(path).suffix != ".gz":
        return write_output(path, chunks)
    with open_atomic(path) as f:
        f.flush()  # nothing is buffered as text; the compressed bytes go to the file below it
        # mtime 0: the same trace gives the same bytes; level 6 is zlib's balance of speed and size
        with gzip.GzipFile(filename="", mode="wb", fileobj=f.buffer, compresslevel=6, mtime=0) as z:
            for chunk in chunks:
                z.write(chunk.encode("utf-8"))
    return Path(path).resolve()
