"""Percentiles of the per-call bus bandwidth of a summary row (``commdebug summary``'s p50, p90
and p99): every value for one rank's calls (:class:`Exact`), or bins 2^(1/256) wide for a whole
job's (:class:`Binned`), whose memory grows with how spread the values are, never with the calls
or the ranks.

    >>> b = Binned(); [b.add(v) for v in (1.0, 2.0, 3.0)]; b.percentiles()[0]   # doctest: +SKIP
    2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["QUANTILES", "Exact", "Binned", "percentile"]

QUANTILES = (0.50, 0.90, 0.99)


def percentile(nth: Callable[[int], float], n: int, q: float) -> float | None:
    """The ``q`` quantile of ``n`` values in order, ``nth(i)`` giving the i-th (linear
    interpolation, as numpy's default)."""
    if n == 0:
        return None
    pos = (n - 1) * q
    lo = int(pos)
    low = nth(lo)
    return low + (nth(min(lo + 1, n - 1)) - low) * (pos - lo)


class Exact:
    """Every per-call busbw of a row: exact percentiles, for one rank's calls."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, value: float) -> None:
        self.values.append(value)

    def percentiles(self) -> list[float | None]:
        self.values.sort()
        return [percentile(self.values.__getitem__, len(self.values), q) for q in QUANTILES]


class Binned:
    """Per-call busbw of a whole job, in bins 2^(1/256) wide (0.27%) that keep their count and
    sum: memory then grows with how spread the bandwidths are, never with the number of calls or
    ranks. A value is read as its bin's mean, so a percentile is exact where the calls of a bin
    agree, and otherwise within 0.27% of the exact figure."""

    STEPS = 256  # bins per doubling
    _ZERO = -(1 << 62)  # busbw 0 (a barrier's) has no logarithm: a bin below all others

    __slots__ = ("bins", "n")

    def __init__(self) -> None:
        self.bins: dict[int, list[float]] = {}  # bin -> [count, sum]
        self.n = 0

    def add(self, value: float) -> None:
        b = math.floor(math.log2(value) * self.STEPS) if value > 0 else self._ZERO
        cell = self.bins.get(b)
        if cell is None:
            self.bins[b] = [1, value]
        else:
            cell[0] += 1
            cell[1] += value
        self.n += 1

    def percentiles(self) -> list[float | None]:
        cells = [self.bins[b] for b in sorted(self.bins)]

        def nth(i: int) -> float:
            seen = 0.0
            for count, total in cells:
                seen += count
                if i < seen:
                    return total / count
            raise IndexError(i)

        return [percentile(nth, self.n, q) for q in QUANTILES]
