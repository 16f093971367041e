"""``commdebug check`` as text: a verdict line, then each finding with its sides."""

from __future__ import annotations

from commdebug.analysis.check import CheckResult

__all__ = ["render_check"]


def render_check(result: CheckResult) -> str:
    """The check's verdict and findings, ending with a newline.

    >>> print(render_check(check_path("traces/")))   # doctest: +SKIP
    """
    what = f"{len(result.ranks)} rank{'s' if len(result.ranks) != 1 else ''}, {result.groups} group{'s' if result.groups != 1 else ''}, {result.collectives} collectives"
    if result.consistent:
        lines = [f"consistent: {what}"]
    else:
        lines = [f"INCONSISTENT: {len(result.findings)} finding{'s' if len(result.findings) != 1 else ''} in {what}", ""]
        for i, f in enumerate(result.findings, 1):
            lines.append(f"{i}. [{f.kind}] {f.message}")
            lines.extend(f"     {side.describe()}" for side in f.sides)
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines) + "\n"
