"""Where ranks parted: call sites compared at each (group, seq), and each rank's steps compared
with its own earlier steps. ``commdebug check``'s ``diverged`` finding and its history rule.

Op, size and dtype alone cannot say where ranks parted: programs issue the same all_reduce from
many lines, so a rank that skipped one lines its next identical call up with the others' skipped
one, and op or size first differ calls later, or never. The call site (module, source line) tells
the calls apart. Ranks may legitimately call the same collective from different lines (a
rank-dependent branch), so against the group's reference rank a difference counts by when it
shows:

- in a rank's first step, and repeated (the same pair of call sites) in a later step before any
  new difference: a branch, a note;
- in a later step, where the earlier steps agreed or only repeated the branch: where the ranks
  parted, a finding, even when op, size and dtype agree (the calls reduced the wrong tensors);
- in the first step, never repeated (or only one step recorded): a branch taken once cannot be
  told from a divergence, so it is a finding only when the ranks go on to disagree (a mismatch or
  a missing call after it), else a note.

Where every call site agrees, the step each call was issued in can still part the ranks: a
rank that skipped a whole step's calls made from the very line of its next ones issues those
next ones a step later than the others (:meth:`GroupSites.step_parting`). Steps are counted
alike on every rank, so the earliest such sequence number is where they parted too, unless the
sites part before it.

Who departed: a majority decides. Where none does (two ranks, a tie), each rank's own steps do:
a rank whose sequence of call sites in that step no earlier step of its own had changed, and its
previous step says how (it skipped a call, issued an extra one, called from another site); a
last step that is a prefix of the previous one was cut short (a hang, the end of the recording),
not changed. When every side, or no side, changed, or the ranks parted in their first step,
history cannot decide, and the finding says so.

Memory: per rank and group, its first departure or its branch and the few steps whose call sites
were new to it; step call-site sequences are interned, so ranks running the same loop share them.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import partial
from itertools import compress, groupby
from operator import is_
from typing import Any, cast

from commdebug.analysis.findings import Change, Finding, Side, who

__all__ = ["UNKNOWN_STEP", "Interner", "Parting", "GroupSites", "BranchNotes", "aligned", "diverged", "history_words", "parted_in_steps", "step_note",
           "once_note", "site"]

UNKNOWN_STEP = -1  # Flight Recorder dumps record no steps
_is_none = partial(is_, None)

SideOf = Callable[[list[int], int, int], Side]  # (ranks, signature id, call-site id) -> Side


class Interner:
    """Values to small integers and back: a thousand ranks' equal values are stored once."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.values: list[Any] = []

    def __call__(self, value: Any) -> int:
        i = self.ids.get(value)
        if i is None:
            i = self.ids[value] = len(self.values)
            self.values.append(value)
        return i

    def many(self, values: Iterable[Any]) -> list[int]:
        """The ids of `values`: looked up in C, one Python call only for values not seen before
        (a rank's ten thousand calls have a few dozen distinct values)."""
        values = list(values)
        found = list(map(self.ids.get, values))
        if None not in found:
            return cast("list[int]", found)  # no None in it, as just asked
        for value in dict.fromkeys(compress(values, map(_is_none, found))):  # the new ones, first seen first
            self(value)
        return list(map(self.ids.__getitem__, values))


@dataclass(frozen=True)
class _Departure:
    """A rank's first call site that differs from the reference's (other than its branch)."""

    seq: int
    step: int
    ctx: int
    sig: int
    settled: bool  # after steps that agreed or repeated a branch; False: in its first step, unconfirmed


@dataclass(frozen=True)
class _Branch:
    """Call sites a rank differs in from its first step on, repeated later: (reference's, its own)."""

    pairs: frozenset[tuple[int, int]]
    seq: int
    step: int
    first: tuple[int, int]  # the pair at `seq`


@dataclass(frozen=True)
class _History:
    first: int  # the rank's first step on the group
    novel: dict[int, tuple[int, int]] | None  # step -> (its call sites, its previous step's), for steps unlike every earlier one
    last: int = UNKNOWN_STEP  # the rank's last step on the group: its record ends in it


@dataclass
class Parting:
    """The earliest sequence number at which ranks of a group call from different sites."""

    seq: int
    sides: list[tuple[list[int], int, int]]  # (ranks, signature id, call-site id), largest first
    odd: list[int]  # the ranks outside the majority; empty when none is larger than every other side
    settled: bool  # False: in the ranks' first step, not confirmed by a later one
    step_of: dict[int, int]  # rank -> its step at `seq`

    @property
    def step(self) -> int | None:
        """The step the ranks parted in: the earliest any of them is in at `seq` (a rank that
        skipped the end of a step is in the next one there); None where no steps are recorded."""
        steps = [s for s in self.step_of.values() if s != UNKNOWN_STEP]
        return min(steps) if steps else None


class GroupSites:
    """One group's call-site bookkeeping: per rank its own history and, against the group's
    reference rank, its first departure or its branch."""

    def __init__(self) -> None:
        self.history: dict[int, _History] = {}
        self.departures: dict[int, _Departure] = {}
        self.branches: dict[int, _Branch] = {}
        self.step_departures: dict[int, tuple[int, int]] = {}  # rank -> its first seq in another step than the reference's, and its step
        self._ref_history: _History | None = None
        self._ref_len = -1  # the reference's own calls (others may extend its arrays)

    def add(self, rank: int, seqs: list[int], steps: list[int], ctxs: list[int], sigs: list[int],
            patterns: Interner, reference: tuple[array, array, int] | None) -> None:
        """One rank's calls on the group, in sequence order; `reference` is the reference's
        call-site ids, steps and first sequence number (None: this rank is the reference)."""
        if reference is None:
            self.history[rank] = self._ref_history = _history(steps, ctxs, patterns)
            self._ref_len = len(seqs) if aligned(seqs, seqs[0], len(seqs)) else -1
            return
        ref_ctx, ref_steps, first = reference
        span = aligned(seqs, first, len(ref_ctx))
        if span is not None and ref_ctx[span].tolist() == ctxs:
            # the usual case, compared in C: the reference's call sites, and where also its
            # steps over its whole range, its history
            in_step = ref_steps[span].tolist() == steps
            same = (span.start, span.stop) == (0, self._ref_len) and in_step
            self.history[rank] = self._ref_history if same and self._ref_history else _history(steps, ctxs, patterns)
            if not in_step:
                self._step_departure(rank, seqs, steps, ref_steps, first)
            return
        self._step_departure(rank, seqs, steps, ref_steps, first)
        self.history[rank] = _history(steps, ctxs, patterns)
        departure, branch = _parting(seqs, steps, ctxs, sigs, ref_ctx, first)
        if departure is not None:
            self.departures[rank] = departure
        if branch is not None:
            self.branches[rank] = branch

    def _step_departure(self, rank: int, seqs: list[int], steps: list[int], ref_steps: array, first: int) -> None:
        """Where the rank first issued a call in another step than the reference did, both known."""
        for seq, step in zip(seqs, steps, strict=True):
            pos = seq - first
            if 0 <= pos < len(ref_steps) and UNKNOWN_STEP not in (step, ref_steps[pos]) and step != ref_steps[pos]:
                self.step_departures[rank] = (seq, step)
                return

    def step_parting(self, ref_sig: array, ref_ctx: array, ref_steps: array, first: int,
                     having: Callable[[int], list[int]]) -> Parting | None:
        """The earliest sequence number that members issued in different steps: the sides are
        the steps (each with the reference's op and call site there). Steps are counted alike on
        every rank (optimizer steps), so a rank that skipped calls made from the very site of its
        next ones, or issued extra ones, shows here before op, size or site can differ."""
        if not self.step_departures:
            return None
        seq = min(s for s, _ in self.step_departures.values())
        pos = seq - first
        step_of = {r: step for r, (s, step) in self.step_departures.items() if s == seq}
        step_of.update((r, ref_steps[pos]) for r in having(seq) if r not in step_of)
        by_step: dict[int, list[int]] = {}
        for r, step in sorted(step_of.items()):
            by_step.setdefault(step, []).append(r)
        if len(by_step) < 2:
            return None
        sides = sorted(((ranks, ref_sig[pos], ref_ctx[pos]) for ranks in by_step.values()), key=lambda s: (-len(s[0]), s[0][0]))
        odd = sorted(r for s in sides[1:] for r in s[0]) if len(sides[0][0]) > len(sides[1][0]) else []
        # unsettled: a finding only where the ranks go on to disagree (steps counted differently,
        # an optimizer.step() only some ranks call, part them too, and nothing after)
        return Parting(seq, sides, odd, False, step_of)

    def parting(self, ref_sig: array, ref_ctx: array, ref_steps: array, first: int,
                having: Callable[[int], list[int]]) -> Parting | None:
        """The earliest departure (settled ones first: an unconfirmed first-step difference must
        not hide a later real one), its sides and its majority; `having(seq)`: the members that
        issued seq."""
        if not self.departures:
            return None
        settled = [d.seq for d in self.departures.values() if d.settled]
        seq = min(settled) if settled else min(d.seq for d in self.departures.values())
        at = {r: d for r, d in self.departures.items() if d.seq == seq}
        pos = seq - first
        by_site: dict[tuple[int, int], list[int]] = {}
        for r, d in at.items():
            by_site.setdefault((d.sig, d.ctx), []).append(r)
        rest = [r for r in having(seq) if r not in at]
        if rest:
            by_site.setdefault((ref_sig[pos], ref_ctx[pos]), []).extend(rest)
        if len(by_site) < 2:
            return None
        sides = sorted(((sorted(rs), sig, ctx) for (sig, ctx), rs in by_site.items()), key=lambda s: (-len(s[0]), s[0][0]))
        odd = sorted(r for s in sides[1:] for r in s[0]) if len(sides[0][0]) > len(sides[1][0]) else []
        step_of = {r: d.step for r, d in at.items()}
        step_of.update((r, ref_steps[pos]) for r in rest)
        return Parting(seq, sides, odd, any(d.settled for d in at.values()), step_of)

    def verdict(self, sides: Sequence[list[int]], step_of: Callable[[int], int | None], since: int | None,
                patterns: Interner, ctxs: Interner) -> tuple[list[int], list[Change], str | None]:
        """Who departed from their own earlier steps, where exactly one side did and every other
        side kept its history: (those ranks, how they changed, None); else ([], [], why history
        cannot decide). A rank's steps from `since` (the earliest step any side is in at the
        parting: a rank that skipped the end of a step is in the next one there) to its own
        step at the parting are looked at."""
        states = [[self._own(r, since, step_of(r))[0] for r in ranks] for ranks in sides]
        changed = [i for i, side in enumerate(states) if all(s == "changed" for s in side)]
        kept = [i for i, side in enumerate(states) if all(s == "kept" for s in side)]
        if len(changed) == 1 and len(kept) == len(sides) - 1:
            ranks = sides[changed[0]]
            return ranks, self.changes(ranks, step_of, since, patterns, ctxs), None
        flat = [s for side in states for s in side]
        if "unknown" in flat or since is None:
            return [], [], "the dumps record no steps to compare with"
        last = max(s for ranks in sides for r in ranks if (s := step_of(r)) is not None)
        when = f"step {since}" if last == since else f"steps {since}-{last}"
        n = sum(len(ranks) for ranks in sides)
        if "first" in flat:
            return [], [], f"the ranks parted in step {since}, their first recorded step: there is no earlier step to compare with"
        if len(changed) == len(sides):
            return [], [], f"{'both' if n == 2 else 'all'} ranks call in {when} otherwise than in their own earlier steps"
        if len(kept) == len(sides):
            return [], [], f"every rank's {when} repeats its own earlier steps"
        return [], [], f"the ranks of one side differ among themselves in whether their {when} repeats their earlier steps"

    def changes(self, ranks: Sequence[int], step_of: Callable[[int], int | None], since: int | None,
                patterns: Interner, ctxs: Interner) -> list[Change]:
        """How each of `ranks` that changed a step (from `since` to its step at the parting)
        differs from its previous step there, ranks that changed alike together."""
        alike: dict[tuple[int, int, int], list[int]] = {}
        for r in ranks:
            state, step = self._own(r, since, step_of(r))
            if state == "changed":
                novel = self.history[r].novel
                assert novel is not None and step is not None
                alike.setdefault((step, *novel[step]), []).append(r)
        out: list[Change] = []
        for (step, now, before), rs in sorted(alike.items(), key=lambda kv: kv[1][0]):
            # a step its record ends in: the calls after its last one were not reached, not skipped
            ended = all(self.history[r].last == step for r in rs)
            out.extend(_how(sorted(rs), step, patterns.values[now], patterns.values[before], ctxs.values, ended))
        return out

    def _own(self, rank: int, since: int | None, step: int | None) -> tuple[str, int | None]:
        """("changed", the first step from `since` to `step` unlike its earlier ones), or
        "kept", "first" (no earlier step to compare with) or "unknown" (no steps recorded)."""
        h = self.history.get(rank)
        if h is None or since is None or step is None or step == UNKNOWN_STEP:
            return "unknown", None
        for s in sorted(h.novel or ()):
            if since <= s <= step:
                return "changed", s
        return ("first", None) if since <= h.first else ("kept", None)


def aligned(seqs: list[int], first: int, length: int) -> slice | None:
    """The positions that a rank's sequence numbers (sorted) take in a reference sequence of
    `length` entries from `first`, when they are contiguous and inside it: then the two compare
    as lists, in C."""
    lo = seqs[0] - first
    if seqs[-1] - seqs[0] != len(seqs) - 1 or lo < 0 or lo + len(seqs) > length:
        return None
    return slice(lo, lo + len(seqs))


def _history(steps: list[int], ctxs: list[int], patterns: Interner) -> _History:
    """The rank's first step, and the steps whose call sites no earlier step of its own had."""
    novel: dict[int, tuple[int, int]] = {}
    seen: set[int] = set()
    prev = -1
    start = 0
    runs = [(step, len(list(run))) for step, run in groupby(steps)]
    for k, (step, count) in enumerate(runs):
        calls = tuple(ctxs[start:start + count])
        start += count
        pid = patterns(calls)
        if k and pid not in seen:
            before = patterns.values[prev]
            cut_short = k == len(runs) - 1 and len(calls) < len(before) and before[:len(calls)] == calls
            if not cut_short:
                novel.setdefault(step, (pid, prev))
        seen.add(pid)
        prev = pid
    return _History(steps[0], novel or None, steps[-1])


def _parting(seqs: list[int], steps: list[int], ctxs: list[int], sigs: list[int], ref_ctx: array,
             first: int) -> tuple[_Departure | None, _Branch | None]:
    """A rank's call sites against the reference's: its first departure and its branch (module
    docstring)."""
    n = len(ref_ctx)
    first_step = steps[0]
    pairs: set[tuple[int, int]] = set()
    at_first = repeated = new = None
    for i, seq in enumerate(seqs):
        pos = seq - first
        if not 0 <= pos < n:
            continue
        rc, c = ref_ctx[pos], ctxs[i]
        if rc == c or rc < 0:
            continue
        if steps[i] == first_step:
            pairs.add((rc, c))
            if at_first is None:
                at_first = i
        elif (rc, c) in pairs:
            if repeated is None:
                repeated = steps[i]
        else:
            new = i
            break

    def departure(i: int, settled: bool) -> _Departure:
        return _Departure(seqs[i], steps[i], ctxs[i], sigs[i], settled)

    if at_first is None:
        return (None if new is None else departure(new, True)), None
    if repeated is not None and (new is None or repeated < steps[new]):
        branch = _Branch(frozenset(pairs), seqs[at_first], steps[at_first], (ref_ctx[seqs[at_first] - first], ctxs[at_first]))
        return (None if new is None else departure(new, True)), branch
    return departure(at_first, False), None


def _how(ranks: list[int], step: int, now: tuple[int, ...], before: tuple[int, ...],
         sites: Sequence[tuple[str | None, str | None]], ended: bool = False) -> list[Change]:
    """The first two differences of a step's call sites from the previous step's. ``ended``: the
    ranks' records end in this step, so the previous step's calls after their last one were never
    reached (``not_reached``), where a call missing before their last one was ``skipped``."""
    out: list[Change] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, before, now, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "delete":
            module, source = sites[before[i1]]
            out.append(Change(ranks, step, "not_reached" if ended and j1 == len(now) else "skipped", module, source, i2 - i1))
        elif tag == "insert":
            module, source = sites[now[j1]]
            out.append(Change(ranks, step, "extra", module, source, j2 - j1))
        else:
            (module, source), (instead_module, instead_source) = sites[now[j1]], sites[before[i1]]
            out.append(Change(ranks, step, "replaced", module, source, j2 - j1, instead_module, instead_source))
        if len(out) == 2:
            break
    return out


# ---- words --------------------------------------------------------------------------------

def site(module: str | None, source: str | None) -> str:
    """"train.py:48 (blocks.2.attn.wo)"; the module alone where no line was recorded."""
    module = None if module in (None, "?") else module
    if source:
        return f"{source} ({module})" if module else source
    return f"in {module}" if module else "an unknown site"


def _action(c: Change) -> str:
    more = f" and {c.count - 1} more after it" if c.count > 1 else ""
    if c.kind == "skipped":
        return f"skipped the call at {site(c.module, c.source)}{more}"
    if c.kind == "not_reached":  # after its last recorded call, in the step its record ends in
        return f"never reached the call at {site(c.module, c.source)}{more}, its record ending before it"
    if c.kind == "extra":
        return f"issued an extra call at {site(c.module, c.source)}{more}"
    return f"called from {site(c.module, c.source)} where its previous step called from {site(c.instead_module, c.instead_source)}"


def history_words(departed: list[int], changes: list[Change], undecided: str | None, majority: bool) -> str:
    """What the ranks' own steps say, to append to a finding's message: with a majority, how the
    odd ranks changed ("; in step 8 rank 402 skipped the call at f.py:48"), if their steps show
    it; without one, who departed ("; rank 1 departed from its own earlier steps: in step 3 it
    skipped ...") or why history cannot decide."""
    if majority:
        return "; " + _how_words(changes, None) if changes else ""
    if not departed:
        return f"; history cannot decide: {undecided}"
    one = len(departed) == 1
    head = f"; {who(departed)} departed from {'its' if one else 'their'} own earlier steps"
    return head + (": " + _how_words(changes, "it" if one else None) if changes else "")


def _how_words(changes: list[Change], subject: str | None) -> str:
    """"in step 3 rank 1 skipped ... and issued ..." (`subject` replaces the ranks' names)."""
    by_ranks: dict[tuple[tuple[int, ...], int], list[Change]] = {}
    for c in changes:
        by_ranks.setdefault((tuple(c.ranks), c.step), []).append(c)
    return "; ".join(f"in step {step} {subject or who(ranks)} " + " and ".join(_action(c) for c in cs)
                     for (ranks, step), cs in by_ranks.items())


def diverged(label: str, p: Parting, side_of: SideOf, departed: list[int], changes: list[Change],
             undecided: str | None) -> Finding:
    """The ``diverged`` finding: where the ranks parted, with the sides' call sites and who
    departed (the majority's odd ranks, or by history)."""
    sides = [side_of(ranks, sig, ctx) for ranks, sig, ctx in p.sides]
    head = f"group {label} seq {p.seq}: "
    if p.odd:
        msg = (f"{head}{_call(p.odd)} from another site than the other {len(p.sides[0][0])} "
               f"(op, size and dtype agree): the ranks parted here{history_words(departed, changes, None, True)}")
    else:
        counts = " against ".join(str(len(ranks)) for ranks, _, _ in sorted(p.sides, key=lambda s: s[0][0]))
        n = sum(len(ranks) for ranks, _, _ in p.sides)
        msg = (f"{head}the {n} ranks call from different sites, {counts} (no majority; op, size and dtype agree): "
               f"the ranks parted here{history_words(departed, changes, undecided, False)}")
        sides.sort(key=lambda s: s.ranks[0])
    if p.odd and not p.settled:
        msg += ("; this is their first recorded step, where a branch taken once looks the same, "
                "but the ranks disagree after it")
    return Finding("diverged", label, p.seq, msg, sides, p.odd, p.step, departed, changes)


def parted_in_steps(label: str, p: Parting, side_of: SideOf, departed: list[int], changes: list[Change],
                    undecided: str | None) -> Finding:
    """The ``diverged`` finding of a :meth:`GroupSites.step_parting`: one call, issued in
    different steps."""
    msg = f"group {label} seq {p.seq}: issued in different steps, {_steps_text(p)} (op, size, dtype and call site agree): the ranks parted here"
    if changes:
        msg += history_words(departed, changes, undecided, bool(p.odd))
    elif len(p.sides) == 2:  # a step with no call on the group is in no rank's history: the counts say it
        (early, _, _), (late, _, _) = sorted(p.sides, key=lambda s: p.step_of[s[0][0]])
        msg += f"; {who(late)} issued fewer of the group's calls by the end of step {p.step_of[early[0]]} than {who(early)}"
        msg += ": a call skipped" if p.odd == late else ": one side skipped a call, or the other issued an extra one" if not p.odd else ""
    return Finding("diverged", label, p.seq, msg, [side_of(ranks, sig, ctx) for ranks, sig, ctx in p.sides], p.odd, p.step,
                   departed, changes)


def _steps_text(p: Parting) -> str:
    return "; ".join(f"{who(ranks)} in step {p.step_of[ranks[0]]}" for ranks, _, _ in sorted(p.sides, key=lambda s: p.step_of[s[0][0]]))


def step_note(label: str, p: Parting, ctxs: Interner) -> str:
    """A :meth:`GroupSites.step_parting` that nothing after contradicts: a note."""
    return (f"group {label} seq {p.seq}: issued in different steps, {_steps_text(p)}, with the same op, size, dtype and call "
            "site, and nothing after disagrees: a call skipped and made up later (the ranks then reduced other steps' "
            "tensors), or steps counted differently on some ranks (an optimizer.step() only they call)")


def once_note(label: str, p: Parting, ctxs: Interner) -> str:
    """A first-step call-site difference that nothing after contradicts: a note."""
    (many, _, ctx), *others = p.sides
    where = "; ".join(f"{_few(ranks)} from {site(*ctxs.values[c])}" for ranks, _, c in others)
    step = "" if p.step is None else f" (step {p.step})"
    return (f"group {label} seq {p.seq}{step}: {_call(many)} from {site(*ctxs.values[ctx])}, {where}, with the same op, "
            "size and dtype, in their first recorded step only, and nothing after disagrees: a branch taken once "
            "(setup), or a divergence later calls evened out")


def _few(ranks: Iterable[int], shown: int = 8) -> str:
    """who(ranks), or for many ranks that do not run in a few ranges, their count and the first
    few: a note about a thousand ranks stays one line."""
    text = who(ranks)
    rs = sorted(set(ranks))
    if len(text) <= 80:
        return text
    return f"{len(rs)} ranks ({','.join(map(str, rs[:shown]))},...)"


def _call(ranks: Iterable[int]) -> str:
    """"rank 1 calls", "ranks 0-3 call"."""
    rs = list(ranks)
    return f"{_few(rs)} {'calls' if len(set(rs)) == 1 else 'call'}"


class BranchNotes:
    """Rank-dependent branches, one note per group label and set of call-site pairs (every
    tensor-parallel group of a job has the same branch: one line, not a thousand)."""

    def __init__(self) -> None:
        self._notes: dict[tuple[str, frozenset], list[Any]] = {}  # -> [ranks, others, first step, first pair]

    def add(self, label: str, sites: GroupSites, members: list[int]) -> None:
        mine = set()
        for rank, b in sites.branches.items():
            note = self._notes.setdefault((label, b.pairs), [set(), set(), b.step, b.first])
            note[0].add(rank)
            note[2] = min(note[2], b.step)
            mine.add(b.pairs)
        for pairs in mine:  # the group's other members call from the reference's sites
            self._notes[(label, pairs)][1].update(members)

    def lines(self, ctxs: Interner) -> list[str]:
        out = []
        for (label, pairs), (ranks, others, step, (theirs, mine)) in self._notes.items():
            more = f" (and {len(pairs) - 1} more pair{'s' if len(pairs) > 2 else ''} of sites)" if len(pairs) > 1 else ""
            since = "" if step == UNKNOWN_STEP else f" since step {step}"
            out.append(f"group {label}: {_call(ranks)} from {site(*ctxs.values[mine])} where {_call(others - ranks)} from "
                       f"{site(*ctxs.values[theirs])}{more}, with the same op, size and dtype, at every step{since}: "
                       "a rank-dependent branch, not a divergence")
        return out
