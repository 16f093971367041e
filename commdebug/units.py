"""Human-readable figures for text reports: sizes in base 1024 as mpitrace prints them, times,
bandwidths in GB/s (1e9 bytes/s, as nccl-tests), shares, and sets of ranks as ranges
(``ranks 0-3,5``). A time, bandwidth or share of None prints as ``-`` (nothing to show: not
timed); a size of None as ``?`` (a value the data does not give), and a sum that leaves some
calls' unknown sizes out says how many (``1.00 KiB (+3 ?)``)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["format_bytes", "format_known_bytes", "format_duration", "format_gbps", "format_share", "who", "ranks_text",
           "UNKNOWN"]

UNKNOWN = "?"  # a value the data does not give, in text and on the page (null in JSON)

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float | None) -> str:
    """A byte count in B, KiB, MiB, GiB or TiB; ``?`` for a size not known.

    >>> format_bytes(1536), format_bytes(None)
    ('1.50 KiB', '?')
    """
    if n is None:
        return UNKNOWN
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_known_bytes(n: float | None, unknown: int = 0) -> str:
    """A sum of sizes that leaves out ``unknown`` calls whose size is not known: the figure and
    how many it leaves out; ``?`` when no size is known (``n`` None).

    >>> format_known_bytes(1536), format_known_bytes(1536, 3), format_known_bytes(None, 3)
    ('1.50 KiB', '1.50 KiB (+3 ?)', '?')
    """
    text = format_bytes(n)
    return f"{text} (+{unknown} ?)" if unknown and n is not None else text


# (unit, seconds per unit), largest first: a duration prints in the first unit it reaches 1 in
_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def format_duration(seconds: float | None) -> str:
    """A duration to 3 significant digits in s, ms, us or ns: as precise as a latency is
    measured, without the trailing zeros that would claim more.

    >>> format_duration(0.779), format_duration(3.7949), format_duration(12.5e-6), format_duration(0.9996)
    ('779 ms', '3.79 s', '12.5 us', '1.00 s')
    >>> format_duration(1234.5), format_duration(0.0), format_duration(None)
    ('1234 s', '0 s', '-')
    """
    if seconds is None:
        return "-"
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return str(seconds)
    rounded = float(f"{seconds:.3g}")  # first, so 0.9996 s reads "1.00 s", not "1000 ms"
    if rounded == 0:
        return "0 s"
    unit, scale = next((u, k) for u, k in _TIME_UNITS if abs(rounded) >= k or u == "ns")
    value = float(f"{rounded / scale:.3g}")  # 1e-7 / 1e-9 is 99.99999...
    size = abs(value)
    if size >= 1000:  # whole seconds past 1,000 keep their digits: "1234 s", never "1.23e+03 s"
        text = f"{seconds / scale:.0f}"
    elif size < 1:  # under a nanosecond: no unit below it
        text = f"{value:.3g}"
    else:
        text = f"{value:.{0 if size >= 100 else 1 if size >= 10 else 2}f}"
    return f"{text} {unit}"



def format_gbps(value: float | None) -> str:
    """GB/s with 2 decimals."""
    return "-" if value is None else f"{value:.2f}"


def format_share(value: float | None) -> str:
    """A fraction as a percentage: ``format_share(0.25) == "25.0%"``."""
    return "-" if value is None else f"{value * 100:.1f}%"


def who(ranks: Iterable[int]) -> str:
    """[3] -> "rank 3"; [0, 1, 2] -> "ranks 0-2"."""
    rs = sorted(set(ranks))
    if not rs:
        return "no rank"
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {ranks_text(rs)}"


def ranks_text(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3,5"."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)
