"""What ``commdebug check`` reports, as data: a :class:`Finding` with its :class:`Side` s and, where
a rank's own steps say how it changed, :class:`Change` s; and the words for a set of ranks.

Kept apart from the check itself so that the modules building findings (:mod:`.check`,
:mod:`.divergence`) share them without importing each other; :mod:`.check` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commdebug.units import ranks_text, who  # re-exported: the analyses and renderers name ranks from here

__all__ = ["Side", "Change", "Finding", "who", "ranks_text"]


@dataclass
class Side:
    """One side of a finding: which ranks, what they issued, where (worded by
    :func:`commdebug.render.check.describe_side`)."""

    ranks: list[int]
    op: str | None = None
    size_bytes: int | None = None
    dtype: str | None = None
    module: str | None = None
    source: str | None = None
    in_flight: bool = False
    last_call: bool = False  # what these ranks did last on the group, not the call in question
    # an all_to_all pair: size_bytes is what this rank sends to `to_rank` / receives from `from_rank`
    to_rank: int | None = None
    from_rank: int | None = None


@dataclass
class Change:
    """How `ranks`' step `step` on a group differs from their previous step there: a call
    ``skipped``, an ``extra`` one, one ``replaced`` by a call from another site, or, after their
    last call in the step their record ends in, one ``not_reached``. `module` and
    `source` name the call skipped, added or put in (the first of `count`); `instead_module` and
    `instead_source` what the previous step called there (``replaced`` only)."""

    ranks: list[int]
    step: int
    kind: str
    module: str | None
    source: str | None
    count: int = 1
    instead_module: str | None = None
    instead_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Finding:
    """One inconsistency (kinds: docs/ranks.md). `step` is the step the call belongs to, where
    the dumps record steps; `departed` the ranks whose own earlier steps show they changed (see
    :mod:`commdebug.analysis.divergence`), with `changes` saying how."""

    kind: str
    group: str
    seq: int | None
    message: str
    sides: list[Side] = field(default_factory=list)
    odd_ranks: list[int] = field(default_factory=list)  # the minority; empty on a tie
    step: int | None = None
    departed: list[int] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "group": self.group, "seq": self.seq, "step": self.step, "message": self.message,
                "sides": [s.__dict__ for s in self.sides], "odd_ranks": self.odd_ranks, "departed": self.departed,
                "changes": [c.to_dict() for c in self.changes]}
