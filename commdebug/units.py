"""Human-readable figures for text reports: sizes in base 1024 as mpitrace prints them, times,
bandwidths in GB/s (1e9 bytes/s, as nccl-tests), shares. None prints as ``-``."""

from __future__ import annotations

__all__ = ["format_bytes", "format_ms", "format_s", "format_gbps", "format_share"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """A byte count in B, KiB, MiB, GiB or TiB.

    >>> format_bytes(1536)
    '1.50 KiB'
    """
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")



def format_ms(seconds: float | None) -> str:
    """Milliseconds with 3 decimals: ``format_ms(0.0125) == "12.500"``."""
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def format_s(seconds: float | None) -> str:
    """Seconds with 3 decimals: ``format_s(1.5) == "1.500"``."""
    return "-" if seconds is None else f"{seconds:.3f}"


def format_gbps(value: float | None) -> str:
    """GB/s with 2 decimals."""
    return "-" if value is None else f"{value:.2f}"


def format_share(value: float | None) -> str:
    """A fraction as a percentage: ``format_share(0.25) == "25.0%"``."""
    return "-" if value is None else f"{value * 100:.1f}%"
