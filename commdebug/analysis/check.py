"""Are the ranks' collectives consistent? ``commdebug check``.

Every member of a process group must issue the group's collectives in the same order, each
with the same op, message size and dtype. For each group this aligns its members' sequences by
sequence number and reports the first place they part:

- ``diverged``: at one sequence number, ranks called from different sites (module, source line)
  where the earlier steps agreed, or in different steps, while op, size and dtype may still agree: where they parted,
  before the mismatch it causes (rules, and who departed when no majority can say:
  :mod:`commdebug.analysis.divergence`);
- ``mismatch``: at one sequence number, ranks issued different ops, sizes or dtypes;
- ``missing``: some ranks never issued a collective the others did (the others wait for them);
  when those others have it unfinished (``in_flight``, a hang dump), the finding says so;
- ``shape``: one call breaks its op's own rule (all_gather output = group size x input,
  reduce_scatter input = group size x output);
- ``all_to_all``: what a member sends to another is not what that one receives from it, where
  both sides recorded their splits (pair by pair: :mod:`commdebug.analysis.alltoall`); else
  (Flight Recorder dumps) the group's members send, in total, other than they receive. The
  all_to_all calls at one sequence number agree when op and dtype agree, whatever each rank's
  sizes (an MoE layer's are uneven by design);
- ``unmatched``: a send with no matching receive, or a receive with no send, by (group, sender,
  receiver, point-to-point sequence), or the two sides' sizes differ;
- ``no_dump``: a rank of the job left no dump in its folder (a rank that the dumps present
  place on another node, and that left nothing here, is *not in this folder*: no finding; the
  verdict covers the ranks present and says so: :mod:`commdebug.model.presence`);
- ``ended``: a rank's process ended without a final dump: a fatal signal its fault record
  names, or a stream whose process this host knows is gone (the run failed, whatever its
  collectives say; a fatal signal after a final dump is a note).

The majority decides which side is odd; where there is none (two ranks, or two halves) the
finding says the ranks disagree and names no side odd, and each rank's own earlier steps name the
one that changed, where they can. Each finding names the group, the step, the ranks on each side,
the sequence number, the op and sizes, and the module and source line on each side.

Dumps are taken a moment apart: a rank may show a collective unfinished that another member
already completed (gloo marks completion on a worker thread, after the caller went on). When any
member of a group completed (group, seq), every member issued it, so it is no hang: it becomes a
note, not an ``in_flight`` finding. A collective some rank never issued is still ``missing``.
For the same reason a record that stops before a call another member completed (a stream that
lost its last second to a crash) is short, not missing those calls: a note says so. A stream
without a final dump never says its rank "never issued" a call: its record ends before it.

Besides findings, the result holds per rank a small summary: how its recording ended
(``metadata.ended_by``), how many collectives it issued, and its last call (group, seq, op,
source line); where a rank stopped early this is the first thing to read. A timed job also gets
its late ranks (``late``: who arrived last and made the others wait; :mod:`.late`), which
never make the ranks inconsistent.

It streams: ranks are read one at a time; per group it keeps one reference sequence (interned
signatures, call sites and steps in integer arrays) and only what differs from it, plus per rank a
few numbers about its call sites, so a thousand ranks of ten thousand collectives fit well under
a gigabyte.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from commdebug.analysis.alltoall import PairMismatch, SplitPairs
from commdebug.analysis.check_digest import LastCall, RankDigest, RankSummary, rank_digest
from commdebug.analysis.died_in import Candidate
from commdebug.analysis.divergence import (
    UNKNOWN_STEP,
    BranchNotes,
    GroupSites,
    Interner,
    Parting,
    aligned,
    diverged,
    history_words,
    once_note,
    parted_in_steps,
    step_note,
)
from commdebug.analysis.endings import ended_findings, settle_last_calls
from commdebug.analysis.findings import Change, Finding, Side, ranks_text, who
from commdebug.analysis.late import LateRanks
from commdebug.analysis.late_tally import LateTally
from commdebug.formats.folders import Dumps, find_job
from commdebug.formats.selection import read_views
from commdebug.model.presence import Absence, FolderScope, Placement, absence
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent
from commdebug.ops import shape_rule
from commdebug.units import format_bytes

__all__ = ["Side", "Change", "Finding", "LastCall", "RankSummary", "RankDigest", "CheckResult", "check", "check_path", "rank_digest", "who"]

_PAIRS_SHOWN = 8  # all_to_all pair findings per group; a shifted split table breaks every pair


@dataclass
class CheckResult:
    findings: list[Finding]
    ranks: list[int]
    groups: int
    collectives: int  # over all ranks
    notes: list[str] = field(default_factory=list)
    rank_summaries: list[RankSummary] = field(default_factory=list)
    late: LateRanks | None = None  # who made the others wait (timed jobs); never a finding
    absence: Absence | None = None  # the job's ranks not in the files read

    @property
    def consistent(self) -> bool:
        return not self.findings

    @property
    def among(self) -> str:
        """"among ranks 2-3 of 4" when the verdict covers only the ranks present (a node's
        folder), else ""."""
        return "" if self.absence is None else self.absence.among()

    @property
    def compared(self) -> bool:
        """Whether anything could be compared: False when the ranks' collectives all lie on
        no known group (the traces name none), so no verdict can be given."""
        return bool(self.collectives) or not any(s.ungrouped for s in self.rank_summaries)

    @property
    def collectives_per_rank(self) -> tuple[int, int]:
        """(fewest, most) collectives any rank issued."""
        counts = [s.collectives for s in self.rank_summaries] or [0]
        return min(counts), max(counts)

    def to_dict(self) -> dict[str, Any]:
        low, high = self.collectives_per_rank
        return {
            "consistent": self.consistent,
            "ranks": len(self.ranks),
            "world_size": self.absence.world_size if self.absence is not None else len(self.ranks),
            "ranks_present": sorted(self.ranks),
            "ranks_absent": [] if self.absence is None else list(self.absence.elsewhere),
            "groups": self.groups,
            "collectives": self.collectives,
            "collectives_per_rank": {"min": low, "max": high},
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes,
            "rank_summaries": [r.to_dict() for r in self.rank_summaries],
            "late_ranks": [] if self.late is None else self.late.to_dict(),
            "startup_skew": [] if self.late is None else self.late.startup_to_dict(),
        }


class _Group:
    """One group's reference sequence and what differs from it."""

    def __init__(self, name: str, label: str, ranks: tuple[int, ...] | None) -> None:
        self.name, self.label, self.ranks = name, label, ranks
        self.ref_rank: int | None = None
        self.first = 0  # sequence number of the reference's first entry
        self.sig = array("i")  # signature id per sequence number, from `first`
        self.ctx = array("i")  # (module, source) id
        self.steps = array("i")  # the step it belongs to (UNKNOWN_STEP: not recorded)
        self.flight = array("b")
        self.members: dict[int, int] = {}  # rank -> its last sequence number (-1: none)
        self.first_of: dict[int, int] = {}  # rank -> its first kept sequence number
        self.last_of: dict[int, tuple[int, int, bool]] = {}  # rank -> its own last call: (sig, ctx, unfinished)
        self.divergent: dict[int, dict[int, list[int]]] = {}  # seq -> sig id -> ranks
        self.diverge_ctx: dict[tuple[int, int], int] = {}  # (seq, sig) -> ctx id of one of them
        self.in_flight: dict[int, list[int]] = {}  # seq -> ranks with it unfinished
        self.a2a: dict[int, list[int]] = {}  # seq -> [sum in, sum out]
        self.a2a_step: dict[int, int] = {}
        self.pairs: SplitPairs | None = None  # all_to_all calls with splits, checked pair by pair
        self.pair_findings = 0
        self.sites = GroupSites()
        self.completed = -1  # the last seq some member's dump says completed
        self.completed_by: int | None = None  # that member


class _Checker:
    def __init__(self, scope: FolderScope | None = None) -> None:
        self.scope = scope
        self.placements: dict[int, Placement] = {}
        self.sigs = Interner()  # (op, size, dtype)
        self.ctxs = Interner()  # (module, source)
        self.patterns = Interner()  # a step's call-site ids on one group
        self.calls = Interner()  # (op, size, dtype, module, source): one lookup per event
        self.call_sig: list[int] = []  # call id -> signature id
        self.call_ctx: list[int] = []  # call id -> call-site id
        self.branches = BranchNotes()
        self.groups: dict[str, _Group] = {}
        self.findings: list[Finding] = []
        self.ranks: list[int] = []
        self.world_size = 0
        self.collectives = 0
        self.rank_notes: dict[str, list[int]] = {}  # a rank's note -> the ranks that have it
        self.notes: list[str] = []  # the check's own
        self.summaries: list[RankSummary] = []
        self.partial: set[int] = set()  # ranks whose record may lack their last calls: a stream, no final dump
        # (group, src, dst, p2p seq) -> (bytes, call site, step or None)
        self.sends: dict[tuple[str, int, int, int], tuple[int | None, int, int | None]] = {}
        self.recvs: dict[tuple[str, int, int, int], tuple[int | None, int, int | None]] = {}
        self.late = LateTally()
        self.beyond: dict[int, list[Candidate]] = {}  # rank -> calls others' records show it issued after its own stops

    def add(self, view: RankView | RankDigest) -> None:
        """One rank: its :class:`RankDigest` (made here from a view, or by the worker that read it)."""
        d = view if isinstance(view, RankDigest) else rank_digest(view)
        rank = d.rank
        self.ranks.append(rank)
        self.placements[rank] = d.placement
        self.world_size = max(self.world_size, d.world_size)
        for note in d.notes:  # the same note on a thousand ranks is said once
            self.rank_notes.setdefault(note, []).append(rank)
        for special in d.specials:  # in call order, as they were met
            if isinstance(special, Finding):
                self.findings.append(special)
            elif special[0] is None:
                self._p2p(rank, special[1], special[2])
            else:
                self._all_to_all(rank, special[0], special[1], special[2])
        self.collectives += d.summary.collectives
        self.summaries.append(d.summary)
        if d.summary.stream_step is not None and not d.summary.final:
            self.partial.add(rank)
        self.late.add(d.late)
        calls = self.calls.many(d.calls)
        for value in self.calls.values[len(self.call_sig):]:  # calls seen for the first time
            rule = shape_rule(value[0])  # balanced (all_to_all): sizes differ by rank, by design
            self.call_sig.append(self.sigs((value[0], None, value[2]) if rule is not None and rule.balanced else value[:3]))
            self.call_ctx.append(self.ctxs(value[3:]))
        call_sig, call_ctx = [self.call_sig[c] for c in calls], [self.call_ctx[c] for c in calls]
        for info, seqs, ids, steps, flight, last_flight in d.groups:
            local = ids.tolist()
            self._sequence(rank, info, seqs.tolist(), list(map(call_sig.__getitem__, local)),
                           list(map(call_ctx.__getitem__, local)), steps.tolist(), flight, last_flight)
        for name, info in d.idle:  # a member of a known group that issued nothing on it
            self._group(name, info).members.setdefault(rank, -1)
        for name, (seq, info) in d.completed.items():
            g = self._group(name, info)
            if seq > g.completed:
                g.completed, g.completed_by = seq, rank

    def _group(self, name: str, info: Any) -> _Group:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = _Group(name, info.label if info.name != "?" else name, info.ranks)
        elif g.ranks is None and info.ranks:
            g.ranks = info.ranks
        return g

    def _sequence(self, rank: int, info: Any, seqs: list[int], sigs: list[int], ctxs: list[int], steps: list[int],
                  flight: frozenset[int], last_flight: bool) -> None:
        """A rank's collectives on one group, in sequence order: their sequence numbers,
        signature and call-site ids, steps, and the positions of the unfinished ones."""
        g = self._group(info.name, info)
        g.members[rank] = seqs[-1]
        g.first_of[rank] = seqs[0]
        g.last_of[rank] = (sigs[-1], ctxs[-1], last_flight)
        if g.ref_rank is None:  # the first member seen is the reference
            g.ref_rank, g.first = rank, seqs[0]
            g.sites.add(rank, seqs, steps, ctxs, sigs, self.patterns, None)
            for i, (seq, s, c, step) in enumerate(zip(seqs, sigs, ctxs, steps, strict=True)):
                _append(g, seq - g.first, s, c, step, i in flight)
            for i in sorted(flight):
                g.in_flight.setdefault(seqs[i], []).append(rank)
            return
        g.sites.add(rank, seqs, steps, ctxs, sigs, self.patterns, (g.ctx, g.steps, g.first))
        ref_sig, first, n = g.sig, g.first, len(g.sig)
        span = aligned(seqs, first, n)
        if span is not None and ref_sig[span].tolist() == sigs:
            # the usual case, compared in C: the reference's calls; only unfinished ones to note
            for i in sorted(flight):
                g.in_flight.setdefault(seqs[i], []).append(rank)
            return
        for i, (seq, s, c, step) in enumerate(zip(seqs, sigs, ctxs, steps, strict=True)):
            if i in flight:
                g.in_flight.setdefault(seq, []).append(rank)
            pos = seq - first
            if 0 <= pos < n:
                if ref_sig[pos] == s or ref_sig[pos] == -1:
                    continue
            elif pos >= n:  # beyond the reference: the reference may be the short one
                _append(g, pos, s, c, step, i in flight)
                n = len(g.sig)
                continue
            else:
                continue  # before the reference's first kept entry: dropped there
            g.divergent.setdefault(seq, {}).setdefault(s, []).append(rank)
            g.diverge_ctx.setdefault((seq, s), c)

    def _all_to_all(self, rank: int, seq: int, e: CollectiveEvent, step: int | None) -> None:
        """One member's side of a balanced op's call (all_to_all; the digest passes no other):
        checked once all members are read, pair by pair where both sides have splits, else by
        the group's totals."""
        g = self._group(e.group.name, e.group)
        if e.send_splits is not None and e.recv_splits is not None and e.group.ranks:
            if g.pairs is None:
                g.pairs = SplitPairs(e.group.ranks)
            self._pair_findings(g, g.pairs.add(rank, seq, e.send_splits, e.recv_splits, self.ctxs((e.module, e.source)), step), e)
            return
        if e.input_bytes is None or e.output_bytes is None:  # sizes not known: no totals to compare
            return
        totals = g.a2a.setdefault(seq, [0, 0])
        g.a2a_step.setdefault(seq, UNKNOWN_STEP if step is None else step)
        totals[0] += e.input_bytes
        totals[1] += e.output_bytes

    def _p2p(self, rank: int, e: CollectiveEvent, step: int | None) -> None:
        peer, p2p_seq = e.peer, e.p2p_seq
        if peer is None or p2p_seq is None:  # not a paired send or receive
            return
        src, dst = (rank, peer) if e.op == "send" else (peer, rank)
        key = (e.group.label, src, dst, p2p_seq)
        (self.sends if e.op == "send" else self.recvs)[key] = (e.size_bytes, self.ctxs((e.module, e.source)), step)

    # ---- findings -------------------------------------------------------------------------

    def result(self) -> CheckResult:
        for g in self.groups.values():
            self._settle(g)
            self._group_findings(g)
        self._p2p_findings()
        settle_last_calls(self.summaries, self.beyond)  # what the evidence says a rank without a final dump was in
        self.findings[0:0] = ended_findings(self.summaries)
        away = absence(self.world_size, self.placements, self.scope)
        if away.here:
            self.findings.insert(0, Finding("no_dump", "", None, f"{who(away.here)} of {self.world_size} left no dump",
                                            [Side(list(away.here))]))
        notes = [f"{who(ranks)}: {note}" for note, ranks in self.rank_notes.items()] + self.notes + self.branches.lines(self.ctxs)
        said = away.note()
        if said is not None:  # first: every figure after it covers the ranks present
            notes.insert(0, said)
        late = self.late.result() if self.late.timed else None
        return CheckResult(self.findings, sorted(self.ranks), len(self.groups), self.collectives, notes,
                           sorted(self.summaries, key=lambda s: s.rank), late, away)

    def _settle(self, g: _Group) -> None:
        """Unfinished collectives that another member completed: not a hang, a note.

        A collective completes on a member only once every member issued it; a dump showing it
        unfinished was written before that rank saw the completion (gloo marks it on a worker
        thread, after releasing the caller)."""
        seqs = sorted(s for s in g.in_flight if s <= g.completed)
        if not seqs:
            return
        ranks = sorted({r for s in seqs for r in g.in_flight.pop(s)})
        it = "it" if len(seqs) == 1 else "them"
        self.notes.append(
            f"group {g.label} seq {ranks_text(seqs)}: unfinished in the dump{'s' if len(ranks) > 1 else ''} of {who(ranks)}, "
            f"but rank {g.completed_by} completed {it}, so every member issued {it}: "
            "the dumps were taken a moment apart, not a hang")

    def _side(self, ranks: list[int], sig: int, ctx: int, in_flight: bool = False) -> Side:
        op, size, dtype = self.sigs.values[sig] if sig >= 0 else (None, None, None)
        module, source = self.ctxs.values[ctx] if ctx >= 0 else (None, None)
        return Side(sorted(ranks), op, size, dtype, module, source, in_flight)

    def _step(self, g: _Group, seq: int) -> int | None:
        pos = seq - g.first
        step = g.steps[pos] if 0 <= pos < len(g.steps) else UNKNOWN_STEP
        return None if step == UNKNOWN_STEP else step

    def _group_findings(self, g: _Group) -> None:
        members = set(g.members)
        if g.ranks:  # members that never issued anything on the group
            for r in g.ranks:
                if r in self.ranks:
                    g.members.setdefault(r, -1)
            members = set(g.members)
        last = max(g.members.values(), default=-1)
        # A member's record can end before calls it issued (a stream that lost its last second
        # to a crash): where another member's record shows a later call completed, every member
        # issued every call up to it. Those calls are known from the others, never "missing".
        proven = min(g.completed, last)
        cut = {r: seq for r, seq in g.members.items() if seq < proven}
        self._cut_notes(g, cut, proven)
        if cut:  # the last call each of them is known to have issued: the call a crashed rank was in, perhaps
            pos = proven - g.first
            op, _, _ = self.sigs.values[g.sig[pos]] if 0 <= pos < len(g.sig) and g.sig[pos] >= 0 else (None, None, None)
            module, source = self.ctxs.values[g.ctx[pos]] if 0 <= pos < len(g.ctx) and g.ctx[pos] >= 0 else (None, None)
            if op is not None:
                for r in cut:
                    self.beyond.setdefault(r, []).append(
                        Candidate(op, g.label, proven, source, module, self._step(g, proven), g.completed_by))
        reach = {r: max(seq, proven) for r, seq in g.members.items()}
        short = sorted(r for r, seq in reach.items() if seq < last)
        stop = min(reach[r] for r in short) + 1 if short else None  # the first seq some rank is not known to have issued
        mismatch = min(g.divergent) if g.divergent else None
        # 0. where call sites parted, before (or at) the first op or size difference
        parting = g.sites.parting(g.sig, g.ctx, g.steps, g.first, lambda seq: self._having(g, seq))
        stepped = g.sites.step_parting(g.sig, g.ctx, g.steps, g.first, lambda seq: self._having(g, seq))
        parting, say, note = (stepped, parted_in_steps, step_note) if stepped and (parting is None or stepped.seq < parting.seq) else (parting, diverged, once_note)
        self.branches.add(g.label, g.sites, sorted(members))
        later = [s for s in (mismatch, stop) if s is not None]
        follows = ""  # where a diverged finding is, for the mismatch or missing call it causes
        if parting is not None and parting.seq != mismatch:
            if later and parting.seq > min(later):
                parting = None  # the ranks had already parted by op, size or count
            elif parting.settled or later:
                departed, changes, undecided = self._who_departed(g, parting, [s[0] for s in parting.sides], parting.odd)
                def side_of(ranks: list[int], sig: int, ctx: int, g: _Group = g, seq: int = parting.seq) -> Side:
                    return self._side(ranks, sig, ctx, self._stuck(g, seq, ranks))

                self.findings.append(say(g.label, parting, side_of, departed, changes, undecided))
                follows = f"; it follows where the ranks parted, seq {parting.seq}"
            else:
                self.notes.append(note(g.label, parting, self.ctxs))
        # 1. different calls at one sequence number: the first one
        if mismatch is not None:
            found = self._mismatch(g, mismatch, parting if parting is not None and parting.seq == mismatch else None)
            found.message += follows
            self.findings.append(found)
        # 2. some members stopped short of the others
        if stop is not None:
            pos = stop - g.first
            ahead = sorted(r for r in members if g.members[r] >= stop)
            missing = sorted(r for r in short if reach[r] < stop)
            sig = g.sig[pos] if 0 <= pos < len(g.sig) else -1
            ctx = g.ctx[pos] if 0 <= pos < len(g.ctx) else -1
            waiting = sorted(set(g.in_flight.get(stop, [])))
            side = self._side(ahead, sig, ctx, in_flight=bool(waiting))
            # a record that may lack the rank's last calls (a stream without a final dump, or one
            # shown short above) cannot say the rank never issued it
            unknown = [r for r in missing if r in self.partial or r in cut]
            never = [r for r in missing if r not in unknown]
            parts = [f"{who(never)} never issued it"] if never else []
            if unknown:
                parts.append(f"{_records(unknown)} {'ends' if len(unknown) == 1 else 'end'} before it "
                             f"(whether {'it' if len(unknown) == 1 else 'they'} issued it is not known)")
            if waiting:
                msg = (f"group {g.label} seq {stop}: {who(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in it (unfinished); "
                       + "; ".join(parts))
            else:
                msg = f"group {g.label} seq {stop}: " + "; ".join(parts) + (f"; {who(ahead)} did" if not unknown
                                                                           else f"; {who(ahead)} issued it")
            msg += follows
            sides = [side]
            for r in missing:  # what each short rank did last on this group: its own record of it
                last_call = g.last_of.get(r)
                side = self._side([r], *last_call) if last_call is not None else Side([r])
                side.last_call = True
                sides.append(side)
            self.findings.append(Finding("missing", g.label, stop, msg, sides, step=self._step(g, stop)))
        elif g.in_flight and min(g.in_flight) not in g.divergent:  # a hang where everyone issued the call
            seq = min(g.in_flight)
            pos = seq - g.first
            waiting = sorted(set(g.in_flight[seq]))
            self.findings.append(Finding("in_flight", g.label, seq,
                f"group {g.label} seq {seq}: {who(waiting)} had it unfinished when they wrote their dumps",
                [self._side(waiting, g.sig[pos], g.ctx[pos], True)], step=self._step(g, seq)))
        if g.pairs is not None:
            self._pair_findings(g, g.pairs.rest())
            if g.pair_findings > _PAIRS_SHOWN:
                self.notes.append(f"group {g.label}: {g.pair_findings - _PAIRS_SHOWN} more all_to_all pairs disagree")
        for seq, (sent, received) in sorted(g.a2a.items()):
            if sent != received and (g.pairs is None or seq not in g.pairs.seqs):
                step = g.a2a_step.get(seq, UNKNOWN_STEP)
                self.findings.append(Finding("all_to_all", g.label, seq,
                    f"group {g.label} seq {seq}: all_to_all members send {format_bytes(sent)} in total but receive {format_bytes(received)}",
                    step=None if step == UNKNOWN_STEP else step))

    def _cut_notes(self, g: _Group, cut: dict[int, int], proven: int) -> None:
        """A note per set of members whose record stops at the same seq before `proven`."""
        by_end: dict[int, list[int]] = {}
        for r, seq in cut.items():
            by_end.setdefault(seq, []).append(r)
        for seq, ranks in sorted(by_end.items()):
            ranks.sort()
            one = len(ranks) == 1
            at = f"at seq {seq}" if seq >= 0 else "before its first call on it" if one else "before their first call on it"
            flushed = ""
            if all(r in self.partial for r in ranks):
                flushed = " (its last flushed chunk)" if one else " (their last flushed chunks)"
            them = "it" if proven == seq + 1 else "them"
            self.notes.append(
                f"group {g.label}: {_records(ranks)} {'stops' if one else 'stop'} {at}{flushed}, but rank {g.completed_by}'s record "
                f"shows seq {ranks_text(range(seq + 1, proven + 1))} completed, so {who(ranks)} issued {them}: the calls after "
                f"{'that' if seq >= 0 else 'the start'} are known from the other members' records")

    def _pair_findings(self, g: _Group, found: list[PairMismatch], e: CollectiveEvent | None = None) -> None:
        """A finding per all_to_all pair that disagrees, the first few of each group."""
        for p in found:
            g.pair_findings += 1
            if g.pair_findings > _PAIRS_SHOWN:
                continue
            op, dtype = (e.op, e.dtype) if e is not None else ("all_to_all", None)
            sides = [self._side([p.src], self.sigs((op, p.sent, dtype)), p.src_site),
                     self._side([p.dst], self.sigs((op, p.received, dtype)), p.dst_site)]
            sides[0].to_rank, sides[1].from_rank = p.dst, p.src
            self.findings.append(Finding("all_to_all", g.label, p.seq,
                f"group {g.label} seq {p.seq}: rank {p.src} sends {format_bytes(p.sent)} to rank {p.dst}, "
                f"but rank {p.dst} receives {format_bytes(p.received)} from rank {p.src}", sides, [p.src, p.dst], p.step))

    @staticmethod
    def _having(g: _Group, seq: int) -> list[int]:
        """The members that issued `seq` (by their first and last kept sequence numbers)."""
        return [r for r, last in g.members.items() if last >= seq and g.first_of.get(r, 0) <= seq]

    @staticmethod
    def _stuck(g: _Group, seq: int, ranks: list[int]) -> bool:
        return bool(ranks) and set(g.in_flight.get(seq, ())).issuperset(ranks)

    def _who_departed(self, g: _Group, parting: Parting, sides: list[list[int]],
                      odd: list[int]) -> tuple[list[int], list[Change], str | None]:
        """With a majority (`odd`: the others), how the odd ranks changed their step, where their
        own history shows it; without one, who departed from their own earlier steps
        (:meth:`GroupSites.verdict`). `sides`: the finding's ranks, by side."""
        step_of = parting.step_of.get
        if odd:
            changes = g.sites.changes(odd, step_of, parting.step, self.patterns, self.ctxs)
            return sorted({r for c in changes for r in c.ranks}), changes, None
        return g.sites.verdict(sides, step_of, parting.step, self.patterns, self.ctxs)

    def _mismatch(self, g: _Group, seq: int, parting: Parting | None) -> Finding:
        """Ranks issued different calls at `seq`: the sides, and the odd ones if a majority
        agrees (the largest side, when larger than every other); on a tie, no side is odd. Where
        call sites parted here too (`parting`), the ranks' own steps say who changed."""
        pos = seq - g.first
        having = self._having(g, seq)
        odd = {r for ranks in g.divergent[seq].values() for r in ranks}
        base = [r for r in having if r not in odd]
        sides = [self._side(base, g.sig[pos], g.ctx[pos], self._stuck(g, seq, base))]
        for sig, ranks in g.divergent[seq].items():
            sides.append(self._side(ranks, sig, g.diverge_ctx[(seq, sig)], self._stuck(g, seq, ranks)))
        sides = sorted((s for s in sides if s.ranks), key=lambda s: (-len(s.ranks), s.ranks[0]))
        head = f"group {g.label} seq {seq}: ranks issued different collectives; "
        step = self._step(g, seq) if parting is None else parting.step
        tie = len(sides) > 1 and len(sides[0].ranks) == len(sides[1].ranks)
        departed: list[int] = []
        changes: list[Change] = []
        history = ""
        if parting is not None:  # its ranks are the ones that issued seq, these sides' ranks
            odd_ranks = [] if tie else [r for s in sides[1:] for r in s.ranks]
            departed, changes, undecided = self._who_departed(g, parting, [s.ranks for s in sides], odd_ranks)
            history = history_words(departed, changes, undecided, majority=not tie)
        if tie:  # no majority
            sides.sort(key=lambda s: s.ranks[0])
            counts = " against ".join(str(len(s.ranks)) for s in sides)
            msg = f"{head}the {sum(len(s.ranks) for s in sides)} ranks disagree, {counts} (no majority){history}"
            return Finding("mismatch", g.label, seq, msg, sides, step=step, departed=departed, changes=changes)
        minority = sorted(r for s in sides[1:] for r in s.ranks)
        verb = "differs" if len(minority) == 1 else "differ"
        msg = f"{head}{who(minority)} {verb} from the other {len(sides[0].ranks)}{history}"
        return Finding("mismatch", g.label, seq, msg, sides, minority, step, departed, changes)

    def _p2p_findings(self) -> None:
        for key in sorted(set(self.sends) | set(self.recvs), key=lambda k: (k[0], k[1], k[2], k[3])):
            group, src, dst, seq = key
            send, recv = self.sends.get(key), self.recvs.get(key)
            if send and recv and (send[0] == recv[0] or send[0] is None or recv[0] is None):  # a size not known cannot differ
                continue
            if send and recv:
                msg = f"group {group}: send #{seq} {src}->{dst} is {format_bytes(send[0])} but the receive is {format_bytes(recv[0])}"
            elif send:
                msg = f"group {group}: send #{seq} from rank {src} to rank {dst} has no matching receive on rank {dst}"
            else:
                msg = f"group {group}: receive #{seq} on rank {dst} from rank {src} has no matching send on rank {src}"
            sides = []
            if send:
                sides.append(self._side([src], self.sigs(("send", send[0], None)), send[1]))
            if recv:
                sides.append(self._side([dst], self.sigs(("recv", recv[0], None)), recv[1]))
            step = send[2] if send else recv[2] if recv else None
            self.findings.append(Finding("unmatched", group, seq, msg, sides, step=step))


def _records(ranks: list[int]) -> str:
    """"rank 1's record", "the records of ranks 1-2"."""
    return f"{who(ranks)}'s record" if len(ranks) == 1 else f"the records of {who(ranks)}"


def _append(g: _Group, pos: int, sig: int, ctx: int, step: int, in_flight: bool) -> None:
    """Put a call at `pos` of the group's reference sequence, after unknowns for a gap (events dropped)."""
    while len(g.sig) < pos:
        g.sig.append(-1)
        g.ctx.append(-1)
        g.steps.append(UNKNOWN_STEP)
        g.flight.append(0)
    g.sig.append(sig)
    g.ctx.append(ctx)
    g.steps.append(step)
    g.flight.append(1 if in_flight else 0)


def check(ranks: Iterable[RankView | RankDigest], scope: FolderScope | None = None) -> CheckResult:
    """Check the ranks' collectives for consistency (see the module docstring); each rank as
    its view or its :func:`rank_digest`. `scope`: what the reader saw around the files
    (:attr:`commdebug.formats.folders.JobFiles.scope`), which tells a rank on another node's
    folder from one that left nothing in its own.

    >>> job = find_job("run/node1")                                             # doctest: +SKIP
    >>> result = check(read_views(job.files, digest=rank_digest), job.scope)   # doctest: +SKIP
    >>> result.among                                                           # doctest: +SKIP
    'among ranks 2-3 of 4'
    """
    checker = _Checker(scope)
    for view in ranks:
        checker.add(view)
    return checker.result()


def check_path(path: Dumps) -> CheckResult:
    """:func:`check` over a folder of rank dumps (ours or Flight Recorder's), a folder of
    per-node folders, several folders, or one dump."""
    job = find_job(path)
    return check(read_views(job.files, digest=rank_digest), job.scope)
