"""all_to_all checked pair by pair: what rank i sends to rank j is what j receives from i.

An expert-parallel MoE layer sends different bytes to every member, per rank and per step, so
the sizes of one all_to_all differ from rank to rank by design; what must hold is the pairing.
:class:`SplitPairs` keeps one group's calls (its members' ``send_splits`` and ``recv_splits``,
by sequence number) as the ranks' dumps are read, checks a call once every member's side is
in and forgets it: memory holds the calls whose members are not all read yet, which, reading
ranks in order, is about one group's worth: 16 bytes per member per member per all_to_all call
of the group (8 MiB per call of a 1,024-member group; 64 KiB for 64 members).

>>> pairs = SplitPairs((0, 1))
>>> pairs.add(0, 5, (4, 8), (4, 16), site=0, step=2)
[]
>>> [(p.src, p.dst, p.sent, p.received) for p in pairs.add(1, 5, (16, 4), (9, 4), site=1, step=2)]
[(0, 1, 8, 9)]
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

__all__ = ["PairMismatch", "SplitPairs"]


class PairMismatch(NamedTuple):
    """At ``seq`` (``step``), ``src`` sends ``sent`` bytes to ``dst``, which receives
    ``received`` from it; ``*_site``: each side's call site, as the caller numbered it."""

    seq: int
    step: int | None
    src: int
    dst: int
    sent: int
    received: int
    src_site: int
    dst_site: int


class _Side(NamedTuple):
    send: array  # of int64: 8 bytes a member, where a tuple of large ints takes about 40
    recv: array
    site: int
    step: int | None


class SplitPairs:
    """One group's all_to_all calls with splits on both sides, by sequence number; ``members``:
    the group's global ranks in group order (the splits' order)."""

    def __init__(self, members: tuple[int, ...]) -> None:
        self.members = members
        self.position = {r: i for i, r in enumerate(members)}
        self.calls: dict[int, dict[int, _Side]] = {}
        self.seqs: set[int] = set()  # every sequence number seen with splits

    def add(self, rank: int, seq: int, send: tuple[int, ...], recv: tuple[int, ...], site: int,
            step: int | None) -> list[PairMismatch]:
        """Take one member's side of call ``seq``; once every member's is in, the pairs that
        disagree (and the call is forgotten). A rank outside the group, or splits not one per
        member, are ignored: nothing can be paired with them."""
        n = len(self.members)
        if rank not in self.position or len(send) != n or len(recv) != n:
            return []
        self.seqs.add(seq)
        sides = self.calls.setdefault(seq, {})
        sides[rank] = _Side(array("q", send), array("q", recv), site, step)
        if len(sides) < n:
            return []
        del self.calls[seq]
        return self._compare(seq, sides)

    def rest(self) -> list[PairMismatch]:
        """The pairs that disagree in calls some member's side is missing from (a rank left no
        dump, or dropped the event): each pair whose two sides are both in."""
        out: list[PairMismatch] = []
        for seq in sorted(self.calls):
            out.extend(self._compare(seq, self.calls[seq]))
        self.calls.clear()
        return out

    def _compare(self, seq: int, sides: dict[int, _Side]) -> list[PairMismatch]:
        members, position = self.members, self.position
        if len(sides) == len(members):
            # transposed in C: row i of the received matrix is what each member got from member i
            from_each = list(zip(*(sides[r].recv for r in members), strict=True))
            rows = [(i, r) for i, r in enumerate(members) if sides[r].send != array("q", from_each[i])]
        else:
            rows = [(position[r], r) for r in sorted(sides, key=position.__getitem__)]
        out = []
        for i, src in rows:
            mine = sides[src]
            for j, dst in enumerate(members):
                other = sides.get(dst)
                if other is not None and mine.send[j] != other.recv[i]:
                    out.append(PairMismatch(seq, mine.step, src, dst, mine.send[j], other.recv[i], mine.site, other.site))
        return out
