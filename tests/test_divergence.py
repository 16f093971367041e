"""`check` finds where ranks parted by call site (module and source line), not only by op and
size, and says who departed when no majority can: the `diverged` finding (issue 29, items 6-7).

Ranks are built as RankViews (no files, no processes), so a thousand ranks take a second; one
test writes real dumps and runs the CLI in process for its exit status and JSON. Real gloo jobs
are in test_divergence_jobs.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from commdebug.analysis.check import check
from commdebug.model.rank_view import RankView
from commdebug.model.trace import CollectiveEvent, GroupInfo
from commdebug.render.check import render_check

# one call: (op, bytes, module, source line)
Call = tuple[str, int, str, str]


def views(world: int, tp: int, step_calls, steps: int) -> Iterator[RankView]:
    """Each rank of `world` issues, on its tensor-parallel group of `tp` consecutive ranks,
    `step_calls(rank, step)` in every step (0..steps-1); sequence numbers count per group."""
    for rank in range(world):
        base = rank - rank % tp
        group = GroupInfo(f"tp{base // tp}", "mesh_tp", tp, tuple(range(base, base + tp)))
        events = []
        for step in range(steps):
            for op, size, module, source in step_calls(rank, step):
                # all_gather's input and reduce_scatter's output are 1/tp of the message
                inb = size // tp if op == "all_gather" else size
                outb = size // tp if op == "reduce_scatter" else size
                events.append(CollectiveEvent(
                    index=len(events), op=op, key="_c10d_functional." + op, aten_op="", step=step, phase="forward",
                    module=module, group=group, seq=len(events), dtype="bfloat16", input_shapes=((inb // 2,),),
                    output_shapes=((outb // 2,),), input_bytes=inb, output_bytes=outb, size_bytes=size,
                    busbw_factor=1.0, source=source))
        yield RankView(rank, Path(f"rank{rank}.json"), {"rank": rank, "world_size": world}, {group.name: group}, events)


# A 2-D job's tensor-parallel block: the same all_reduce from three lines, then an all_gather.
WO = ("all_reduce", 1024, "blocks.2.attn.wo", "train_2d.py:48")
W2 = ("all_reduce", 1024, "blocks.2.mlp.w2", "train_2d.py:57")
OUT = ("all_reduce", 1024, "blocks.2.out", "train_2d.py:63")
GATHER = ("all_gather", 8192, "output", "train_2d.py:70")


def tp_block(skipper: int, at: int):
    def calls(rank: int, step: int) -> list[Call]:
        if rank == skipper and step == at:
            return [W2, OUT, GATHER]
        return [WO, W2, OUT, GATHER]
    return calls


def test_a_skipped_call_followed_by_an_identical_one_is_where_the_ranks_parted():
    """1,024 ranks, groups of 8: rank 402 skips blocks.2.attn.wo's all_reduce in step 8. Its next
    all_reduce (same op and size, another line) pairs with the others' skipped one; op and size
    first differ two calls later."""
    result = check(views(1024, 8, tp_block(402, 8), steps=10))
    diverged, mismatch = result.findings[:2]
    parted = 8 * 4  # step 8's first call on the group
    assert (diverged.kind, diverged.group, diverged.seq, diverged.step) == ("diverged", "mesh_tp[8]", parted, 8)
    assert diverged.odd_ranks == [402]
    majority, odd = diverged.sides
    assert majority.ranks == [400, 401, *range(403, 408)] and (majority.module, majority.source) == WO[2:]
    assert odd.ranks == [402] and (odd.module, odd.source) == W2[2:]
    assert odd.op == majority.op == "all_reduce" and odd.size_bytes == majority.size_bytes
    assert "rank 402" in diverged.message and "skipped the call at train_2d.py:48" in diverged.message
    # then the op mismatch it causes, with its step
    assert (mismatch.kind, mismatch.seq, mismatch.step, mismatch.odd_ranks) == ("mismatch", parted + 2, 8, [402])
    text = render_check(result)
    assert text.index("[diverged]") < text.index("[mismatch]")
    assert "rank 402: all_reduce 1.00 KiB bfloat16 in blocks.2.mlp.w2 at train_2d.py:57" in text


def test_a_rank_dependent_branch_from_the_first_step_is_a_note():
    """Odd ranks issue the same all_reduce from another line than even ranks, every step."""
    def calls(rank: int, step: int) -> list[Call]:
        mine = ("all_reduce", 64, "Global", "branch.py:22" if rank % 2 else "branch.py:20")
        return [WO, mine, GATHER]

    result = check(views(8, 8, calls, steps=4))
    assert result.consistent, [f.message for f in result.findings]
    [note] = [n for n in result.notes if "branch.py:22" in n]
    assert "ranks 1,3,5,7" in note and "branch.py:20" in note and "every step" in note
    assert render_check(result).startswith("consistent: 8 ranks")


def test_a_branch_then_a_skip_is_still_found():
    def calls(rank: int, step: int) -> list[Call]:
        mine = ("all_reduce", 64, "Global", "branch.py:22" if rank % 2 else "branch.py:20")
        return [mine, WO, W2, GATHER] if (rank, step) != (5, 3) else [mine, W2, GATHER]

    result = check(views(8, 8, calls, steps=5))
    first = result.findings[0]
    assert (first.kind, first.seq, first.step, first.odd_ranks) == ("diverged", 3 * 4 + 1, 3, [5])
    assert "skipped the call at train_2d.py:48" in first.message


def test_call_sites_that_part_with_op_and_size_still_agreeing_are_a_finding():
    """A rank that skipped one all_reduce and issued an extra one at the end of the step reduced the
    wrong tensors: no op, size or dtype differs anywhere."""
    def calls(rank: int, step: int) -> list[Call]:
        return [W2, OUT, WO] if (rank, step) == (2, 1) else [WO, W2, OUT]

    result = check(views(4, 4, calls, steps=3))
    [f] = result.findings
    assert (f.kind, f.seq, f.step, f.odd_ranks) == ("diverged", 3, 1, [2])
    assert "op, size and dtype agree" in f.message


# ---- two ranks: no majority, so each rank's own earlier steps decide

def fsdp(skipper: int, at: int, then_identical: bool = False):
    """FSDP2-like steps: all_gather, the metric all_reduce at fsdp_skip.py:48, (another all_reduce),
    reduce_scatter. `skipper` leaves out the metric all_reduce in step `at`."""
    gather = ("all_gather", 4096, "FSDPModel.blocks.0", "fsdp_skip.py:60")
    metric = ("all_reduce", 4, "FSDPModel.metric", "fsdp_skip.py:48")
    loss = ("all_reduce", 4, "Global", "fsdp_skip.py:71")
    scatter = ("reduce_scatter", 4096, "FSDPModel.blocks.0", "fsdp_skip.py:66")

    def calls(rank: int, step: int) -> list[Call]:
        middle = [metric, loss] if then_identical else [metric]
        if (rank, step) == (skipper, at):
            middle = middle[1:]
        return [gather, *middle, scatter]
    return calls


def test_two_ranks_one_skip_names_the_rank_that_departed_from_its_own_steps():
    for skipper in (0, 1):
        result = check(views(2, 2, fsdp(skipper, 3), steps=6))
        first = result.findings[0]
        assert first.seq == 3 * 3 + 1 and first.step == 3
        assert first.odd_ranks == []  # no majority
        assert first.departed == [skipper], first.message
        assert f"rank {skipper} departed from its own earlier steps" in first.message
        assert "skipped the call at fsdp_skip.py:48" in first.message
        assert "1 against 1" in first.message


def test_two_ranks_one_skip_with_identical_calls_is_diverged_and_named():
    result = check(views(2, 2, fsdp(1, 3, then_identical=True), steps=6))
    first = result.findings[0]
    assert (first.kind, first.seq, first.step, first.departed) == ("diverged", 3 * 4 + 1, 3, [1])
    assert "rank 1 departed from its own earlier steps" in first.message
    change = first.to_dict()["changes"][0]
    assert (change["ranks"], change["kind"], change["source"], change["step"]) == ([1], "skipped", "fsdp_skip.py:48", 3)


def test_history_says_when_it_cannot_decide():
    step0 = check(views(2, 2, fsdp(1, 0), steps=3)).findings[0]
    assert step0.departed == [] and "history cannot decide" in step0.message and "step 0" in step0.message

    def both(rank: int, step: int) -> list[Call]:  # both ranks change their step 2, differently
        if step == 2:
            return [WO, W2] if rank == 0 else [W2, WO]
        return [OUT, GATHER]

    f = check(views(2, 2, both, steps=4)).findings[0]
    assert f.departed == [] and "history cannot decide" in f.message and "both" in f.message


def test_every_finding_names_its_step():
    def calls(rank: int, step: int) -> list[Call]:  # rank 3 stops in step 2, after its first call
        if rank == 3 and step >= 2:
            return [WO] if step == 2 else []
        return [WO, GATHER]

    result = check(views(4, 4, calls, steps=4))
    [missing] = [f for f in result.findings if f.kind == "missing"]
    assert missing.step == 2 and missing.to_dict()["step"] == 2
    assert "(step 2)" in render_check(result)


def test_the_cli_exits_1_and_its_json_carries_the_divergence(tmp_path, capsys):
    from commdebug.cli import main
    from commdebug.model.dump import to_dump_dict
    from commdebug.model.trace import Trace

    for view in views(4, 4, lambda rank, step: [W2, OUT] if (rank, step) == (1, 2) else [WO, W2], steps=4):
        trace = Trace()
        for e in view.events:
            trace.add_group(e.group)
            trace.add_event(e)
        trace.metadata.update(view.metadata)
        (tmp_path / f"rank{view.rank}.json").write_text(json.dumps(to_dump_dict(trace)))
    assert main(["check", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    first = out["findings"][0]
    assert (first["kind"], first["seq"], first["step"], first["odd_ranks"]) == ("diverged", 4, 2, [1])
    assert first["changes"][0]["kind"] == "skipped" and first["changes"][0]["source"] == "train_2d.py:48"


GRAD = ("all_reduce", 4096, "Global", "train.py:9")  # a loop over the parameters: one line for both
BIAS = ("all_reduce", 128, "Global", "train.py:9")


def test_calls_a_rank_skipped_from_the_site_of_its_next_ones_part_the_ranks_where_their_steps_differ():
    """Three ranks reduce two gradients a step from one line; rank 2 skips step 3's pair. Its
    later calls pair with the others' earlier ones, with the same op, size and site: only the
    step each was issued in shows where the ranks parted, four calls before the one it never
    issues."""
    result = check(views(3, 3, lambda rank, step: [] if rank == 2 and step == 3 else [GRAD, BIAS], steps=6))
    diverged, missing = result.findings
    assert (diverged.kind, diverged.seq, diverged.step, diverged.odd_ranks) == ("diverged", 6, 3, [2])
    assert "seq 6: issued in different steps, ranks 0-1 in step 3; rank 2 in step 4" in diverged.message
    assert "rank 2 issued fewer of the group's calls by the end of step 3 than ranks 0-1: a call skipped" in diverged.message
    assert (missing.kind, missing.seq) == ("missing", 10) and "it follows where the ranks parted, seq 6" in missing.message
    text = render_check(result)
    assert text.index("[diverged]") < text.index("[missing]")
    # the same calls in the same steps everywhere: nothing to say
    assert check(views(3, 3, lambda rank, step: [GRAD, BIAS], steps=6)).findings == []
    # made up in the next step: nothing after disagrees, so it is a note (an optimizer.step() that
    # only some ranks call shifts their steps alike)
    def made_up(rank: int, step: int) -> list[Call]:
        return [GRAD, BIAS] * {3: 0, 4: 2}.get(step, 1) if rank == 2 else [GRAD, BIAS]

    quiet = check(views(3, 3, made_up, steps=6))
    assert quiet.findings == [] and any("seq 6: issued in different steps, ranks 0-1 in step 3; rank 2 in step 4" in n and
                                        "nothing after disagrees" in n for n in quiet.notes), quiet.notes
    # an extra pair instead: the rank's own steps name it
    [extra, _] = check(views(3, 3, lambda rank, step: [GRAD, BIAS] * (2 if rank == 2 and step == 3 else 1), steps=6)).findings
    assert (extra.kind, extra.seq, extra.odd_ranks) == ("diverged", 8, [2])
    assert "rank 2 in step 3; ranks 0-1 in step 4" in extra.message and "in step 3 rank 2 issued an extra call at train.py:9" in extra.message
