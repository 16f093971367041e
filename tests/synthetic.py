"""Synthetic dumps, for the viewer's tests, demos and scale benchmark.

`transformer_dump()` builds what commdebug would write (docs/json-format.md; schema version 2,
events by column, or 1 with ``schema=1``) for a Llama-style tensor-parallel transformer, without
running one. Events are real :class:`~commdebug.model.trace.CollectiveEvent` tuples encoded by
:func:`commdebug.model.events.encode_events`, so the page reads what commdebug writes. The numbers are invented but
obey the format's rules, so a viewer that shows them right shows real dumps right:

* every collective call is an event; node counts and bytes are derived from the calls, with
  descendants included and phases exclusive (`backward` excludes `checkpoint`), while the
  reference's `collectives_backward` includes checkpoint recompute;
* op rows are aggregated over steps (`count`) and filtered by the dump's noise level.

`to_reference()` turns such a dump into what torch's CommDebugMode would have written, and
`rank_dumps()` writes a folder of per-rank dumps of one job (the viewer's folder page).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

from commdebug.model.events import encode_events
from commdebug.model.trace import TRIVIAL_OPS, CollectiveEvent, GroupInfo
from commdebug.ops import BUSBW_FACTORS, packet_for_op, shape_rule, spec_for_op

__all__ = ["REFERENCE_TRIVIAL_OPS", "event_dicts", "plant_late", "rank_dumps", "to_reference", "transformer_dump",
           "write_rank_dumps"]

# torch.distributed.tensor.debug._comm_mode.trivial_ops, in a stable order.
REFERENCE_TRIVIAL_OPS = sorted(TRIVIAL_OPS)


def _collective(op: str) -> tuple[str, str, Callable[[int], float]]:
    """(reference key, dispatched overload, busbw factor as a function of group size) of the
    registry's first row for `op`: what a real capture of that op records."""
    spec = spec_for_op(op)
    assert spec is not None, op
    return spec.compat_key, f"{packet_for_op(op)}.default", BUSBW_FACTORS[spec.factor]


# The ops the synthetic model issues; the order gives each its source line in train.py.
_COLLECTIVES = {op: _collective(op) for op in ("all_reduce", "all_gather", "reduce_scatter", "barrier")}
_BF16 = 2  # bytes per element


def _nbytes(shape: list[int]) -> int:
    """bf16 bytes of a tensor of `shape`; [] (a barrier's) is no tensor."""
    return math.prod(shape) * _BF16 if shape else 0


@dataclasses.dataclass
class _Call:
    """One collective a module issues itself, once per step and phase."""
    op: str
    shape: list[int]  # S = prod(shape) * 2 bytes, the message size
    dtensor_op: str | None = None
    placements: str | None = None


@dataclasses.dataclass
class _Module:
    fqn: str
    cls: str
    params: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    children: list[_Module] = dataclasses.field(default_factory=list)
    calls: dict[str, list[_Call]] = dataclasses.field(default_factory=dict)  # by phase
    ops: dict[str, list[dict]] = dataclasses.field(default_factory=dict)     # by phase, per step
    checkpointed: bool = False  # its forward is recomputed in backward

    def add(self, name: str, cls: str, **kw: Any) -> _Module:
        child = _Module(f"{self.fqn}.{name}", cls, **kw)
        self.children.append(child)
        return child


def _mesh(world_size: int) -> str:
    return f"DeviceMesh(({world_size},), 'cpu', stride=(1,))"


def _row(name: str, mesh: str, *dtensor_args: tuple[list[int], str]) -> dict:
    """An op row (without `count`); dtensor_args are (local shape, placements) per DTensor arg."""
    return {
        "name": name,
        "input_shape": [f"torch.Size({list(shape)})" for shape, _ in dtensor_args],
        "input_sharding": [placements for _, placements in dtensor_args],
        "device_mesh": mesh if dtensor_args else "",
        "is_bw": False,
        "is_activation_checkpointing": False,
    }


def _linear_ops(mesh: str, x: list[int], w: list[int], out: list[int], x_p: str, w_p: str) -> dict:
    t = [w[1], w[0]]
    return {
        "forward": [
            _row("aten._to_copy.default", mesh, (w, w_p)),
            _row("aten.t.default", mesh, (w, w_p)),
            _row("aten.view.default", mesh, (x, x_p)),
            _row("aten.mm.default", mesh, (x, x_p), (t, w_p)),
            _row("aten._unsafe_view.default", mesh, (out, x_p)),
            _row("aten.detach.default", mesh, (w, w_p)),
            _row("aten.detach.default", mesh),
        ],
        "backward": [
            _row("aten.t.default", mesh, (t, w_p)),
            _row("aten.mm.default", mesh, (out, x_p), (w, w_p)),
            _row("aten.t.default", mesh, (out, x_p)),
            _row("aten.mm.default", mesh, (list(reversed(out)), x_p), (x, x_p)),
            _row("aten.t.default", mesh, (w, w_p)),
            _row("aten.view.default", mesh, (x, x_p)),
            _row("aten._to_copy.default", mesh, (w, w_p)),
            _row("aten.add_.Tensor", mesh, (w, w_p), (w, w_p)),
            _row("aten.detach.default", mesh),
            _row("aten.empty_like.default", mesh),
        ],
    }


def _local_ops(*names: str) -> dict:
    """Rows of a module working on plain tensors (no DTensor argument)."""
    return {"forward": [_row(n, "") for n in names],
            "backward": [_row(n, "") for n in names if n != "aten.detach.default"]}


def _build_model(root: str, layers: int, ws: int, *, dim: int, ffn: int, vocab: int,
                 tokens: int, checkpoint_every: int) -> _Module:
    mesh = _mesh(ws)
    col, row = "(Shard(dim=0),)", "(Shard(dim=1),)"
    rep, last = "(Replicate(),)", "(Shard(dim=-1),)"
    act = [tokens, dim]

    def linear(parent: _Module, name: str, d_in: int, d_out: int, colwise: bool, **kw: Any) -> _Module:
        if colwise:
            ops = _linear_ops(mesh, [tokens, d_in], [d_out // ws, d_in], [tokens, d_out // ws], rep, col)
        else:
            ops = _linear_ops(mesh, [tokens, d_in // ws], [d_out, d_in // ws], [tokens, d_out], last, row)
        return parent.add(name, "class 'torch.nn.modules.linear.Linear'",
                          params=[("weight", col if colwise else row)], ops=ops, **kw)

    norm_ops = _local_ops("aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.rsqrt.default",
                          "aten.mul.Tensor", "aten.detach.default")
    model = _Module(root, f"class 'model.{root}'")
    model.add("tok_embeddings", "class 'torch.nn.modules.sparse.Embedding'", params=[("weight", row)],
              calls={"forward": [_Call("all_reduce", act, "aten.embedding.default", row)]},
              ops=_local_ops("aten.embedding.default"))
    for i in range(layers):
        block = model.add(f"layers.{i}", "class 'model.TransformerBlock'",
                          checkpointed=checkpoint_every > 0 and i % checkpoint_every == checkpoint_every - 1)
        block.add("attention_norm", "class 'model.RMSNorm'", ops=norm_ops)
        attn = block.add("attention", "class 'model.Attention'", ops=_local_ops("aten.view.default"))
        # The input gradients of wq/wk/wv are partial sums: one all_reduce in backward.
        linear(attn, "wq", dim, dim, True,
               calls={"backward": [_Call("all_reduce", act, "aten.mm.default", col)]})
        linear(attn, "wk", dim, dim // 4, True)
        linear(attn, "wv", dim, dim // 4, True)
        for name in ("q_norm", "k_norm"):
            attn.add(name, "class 'model.RMSNorm'", ops=norm_ops)
        attn.add("rotary_emb", "class 'model.RotaryEmbedding'",
                 ops=_local_ops("aten.view_as_complex.default", "aten.mul.Tensor", "aten.view_as_real.default"))
        attn.add("sdpa", "class 'model.ScaledDotProductAttention'",
                 ops=_local_ops("aten._scaled_dot_product_flash_attention.default"))
        attn.add("attn_dropout", "class 'torch.nn.modules.dropout.Dropout'", ops=_local_ops("aten.native_dropout.default"))
        linear(attn, "wo", dim, dim, False,
               calls={"forward": [_Call("all_reduce", act, "aten.mm.default", row)]})
        attn.add("resid_dropout", "class 'torch.nn.modules.dropout.Dropout'", ops=_local_ops("aten.native_dropout.default"))
        block.add("ffn_norm", "class 'model.RMSNorm'", ops=norm_ops)
        ff = block.add("feed_forward", "class 'model.FeedForward'", ops=_local_ops("aten.mul.Tensor"))
        linear(ff, "w1", dim, ffn, True, calls={"backward": [_Call("all_reduce", act, "aten.mm.default", col)]})
        linear(ff, "w3", dim, ffn, True)
        ff.add("act_fn", "class 'torch.nn.modules.activation.SiLU'", ops=_local_ops("aten.silu.default"))
        linear(ff, "w2", ffn, dim, False, calls={"forward": [_Call("all_reduce", act, "aten.mm.default", row)]})
        ff.add("dropout", "class 'torch.nn.modules.dropout.Dropout'", ops=_local_ops("aten.native_dropout.default"))
    model.add("norm", "class 'model.RMSNorm'", ops=norm_ops)
    # Vocabulary-parallel output gathered for the loss; all_gather's backward is a reduce_scatter.
    linear(model, "output", dim, vocab, True, calls={
        "forward": [_Call("all_gather", [tokens, vocab], "aten.mm.default", col)],
        "backward": [_Call("reduce_scatter", [tokens, vocab], "aten.mm.default", col)]})
    return model


def _step_calls(model: _Module) -> list[tuple[_Module, str, _Call]]:
    """(module, phase, call) in the order one training step issues them."""
    order: list[tuple[_Module, str, _Call]] = []

    def forward(m: _Module, phase: str) -> None:
        order.extend((m, phase, c) for c in m.calls.get("forward", []))
        for child in m.children:
            forward(child, phase)

    def backward(m: _Module) -> None:
        if m.checkpointed:  # recompute the forward before differentiating through it
            forward(m, "checkpoint")
        for child in reversed(m.children):
            backward(child)
        order.extend((m, "backward", c) for c in m.calls.get("backward", []))

    forward(model, "forward")
    backward(model)
    order.extend((m, "optimizer", c) for m, _ in _modules(model) for c in m.calls.get("optimizer", []))
    return order


def _modules(m: _Module, ancestors: tuple[_Module, ...] = ()):
    """(module, its ancestors) in pre-order."""
    yield m, ancestors
    for child in m.children:
        yield from _modules(child, (*ancestors, m))


def _keep(row: dict, noise_level: int) -> bool:
    """Whether a dump written at `noise_level` keeps this op row (docs/json-format.md)."""
    if noise_level < 3 and row["name"] in TRIVIAL_OPS:
        return False
    return noise_level >= 2 or (noise_level == 1 and bool(row["input_sharding"]))


def transformer_dump(layers: int = 2, steps: int = 2, *, world_size: int = 8, noise_level: int = 3,
                     root: str = "Transformer", checkpoint_every: int = 2, max_events: int = 100_000,
                     dim: int = 4096, ffn: int = 14336, vocab: int = 128256, tokens: int = 16384,
                     schema: int = 2, rank: int = 0, job_size: int | None = None,
                     odd_module: str | None = None, latency_scale: float = 1.0,
                     ) -> dict:
    """A dump of `steps` training steps of a `layers`-layer TP transformer on `rank`.

    Every `checkpoint_every`-th block is activation-checkpointed (0: none). Each step starts
    with a barrier issued outside any module, so Global issues collectives itself; in schema 2
    each step also ends with a gradient-norm all_reduce in the optimizer phase.

    `world_size` is the tensor-parallel group's size (rank r is in group r // world_size, ranks
    in blocks); `job_size` is the job's world size in the metadata (default `world_size`).
    `odd_module` plants a bug: that module's first call of step 0 is twice as large on this rank.
    `latency_scale` multiplies every latency (ranks of one job run at different speeds).
    """
    if schema not in (1, 2):
        raise ValueError(f"schema {schema}: 1 or 2")
    model = _build_model(root, layers, world_size, dim=dim, ffn=ffn, vocab=vocab, tokens=tokens,
                         checkpoint_every=checkpoint_every)
    glob_calls = {"forward": [_Call("barrier", [])]}
    if schema >= 2:  # clip_grad_norm_: one scalar all_reduce inside optimizer.step()
        glob_calls["optimizer"] = [_Call("all_reduce", [1])]
    glob = _Module("Global", "", calls=glob_calls, children=[model])
    phases = PHASES_V2 if schema >= 2 else PHASES_V1
    nodes: dict[str, dict] = {}
    ancestry: dict[str, tuple[_Module, ...]] = {}  # fqn -> Global ... the module itself
    for m, ancestors in _modules(glob):
        ancestry[m.fqn] = (*ancestors, m)
        nodes[m.fqn] = _node(m, any(a.checkpointed for a in ancestry[m.fqn]), steps, noise_level, schema)
        if ancestors:
            nodes[ancestors[-1].fqn]["children"].append(nodes[m.fqn])

    base = rank // world_size * world_size
    group = GroupInfo(str(rank // world_size), "mesh_tp" if schema >= 2 else "", world_size,
                      tuple(range(base, base + world_size)))
    calls: dict[str, dict[tuple[str, str], list[int]]] = {fqn: {} for fqn in nodes}  # descendants included
    events: list[CollectiveEvent] = []
    index = 0
    clock = 0.0
    for step in range(steps):
        for m, phase, call in _step_calls(glob):
            if odd_module == m.fqn and step == 0:
                call, odd_module = dataclasses.replace(call, shape=[2 * call.shape[0], *call.shape[1:]]), None
            size = _nbytes(call.shape)
            for a in ancestry[m.fqn]:
                totals = calls[a.fqn].setdefault((call.op, phase), [0, 0])
                totals[0] += 1
                totals[1] += size
            event = _event(index, step, phase, m.fqn, call, group, clock, latency_scale)
            clock += 1e-3 + (event.latency_s or 0.0)
            if index < max_events:
                events.append(event)
            index += 1
    for fqn, node in nodes.items():
        node.update(_collectives(calls[fqn], world_size, phases))

    by_op: dict[str, dict[str, int]] = {}
    for (op, _), (count, size) in calls["Global"].items():
        total = by_op.setdefault(op, {"count": 0, "bytes": 0})
        total["count"] += count
        total["bytes"] += size
    dump = nodes["Global"]
    section: dict[str, Any] = {
        "schema_version": schema,
        "noise_level": noise_level,
        "trivial_ops": list(REFERENCE_TRIVIAL_OPS),
        "metadata": {"rank": rank, "world_size": job_size or world_size, "hostname": f"synthetic-node{rank // 8}",
                     "pid": 4242 + rank, "torch_version": "2.13.0", "commdebug_version": "synthetic",
                     "backend": "fake", "start_time": "2026-11-22T05:00:00+00:00",
                     "end_time": "2026-11-22T05:01:00+00:00", "steps": steps},
    }
    if schema >= 2:
        section["groups"] = {group.name: group.to_dict()}
    section["summary"] = {"collectives": index, "bytes": sum(v["bytes"] for v in by_op.values()),
                          "by_op": dict(sorted(by_op.items()))}
    section["events"] = encode_events(events) if schema >= 2 else [_event_v1(e) for e in events]
    section["events_dropped"] = index - len(events)
    section["max_events"] = max_events
    dump["commdebug"] = section
    return dump


def event_dicts(dump: dict) -> list[dict]:
    """The dump's events as one dict per event, either schema (schema 1's inline group becomes
    its name, as in schema 2), for tests that compare the page with the dump."""
    from commdebug.model.dump import from_dump_dict

    raw = dump["commdebug"]["events"]
    if isinstance(raw, list):
        return [dict(e, group=e["group"]["name"] if isinstance(e["group"], dict) else e["group"]) for e in raw]
    return [e.to_dict() for e in from_dump_dict(dump).events]


PHASES_V1 = ("forward", "backward", "checkpoint")
PHASES_V2 = ("forward", "backward", "checkpoint", "optimizer")


def _node(m: _Module, in_checkpoint: bool, steps: int, noise_level: int, schema: int) -> dict:
    """A module's node without its collectives: op rows counted over `steps`, noise-filtered."""
    node = {
        "fqn": m.fqn,
        "module_type": m.cls if noise_level > 0 else "",
        "parameters": [list(p) for p in m.params] if noise_level > 0 else [],
        "children": [],
    }
    forward = m.ops.get("forward", [])
    for phase, key, rows in (("forward", "operations_forward", forward),
                             ("backward", "operations_backward", m.ops.get("backward", [])),
                             ("checkpoint", "operations_checkpointing", forward if in_checkpoint else [])):
        node[key] = [dict(r, is_bw=phase != "forward", is_activation_checkpointing=phase == "checkpoint",
                          count=steps) for r in rows if _keep(r, noise_level)]
    if schema >= 2:
        node["operations_optimizer"] = []
    return node


def _collectives(calls: dict[tuple[str, str], list[int]], world_size: int, phases: tuple[str, ...]) -> dict:
    """The node keys derived from its (op, phase) -> [calls, bytes], descendants included."""
    keyed: dict[str, dict[str, int]] = {"forward": {}, "backward": {}}
    for (op, phase), (count, _) in calls.items():
        # The reference's per-phase op-key counts: backward includes checkpoint recompute, and
        # (as commdebug writes them) forward includes the optimizer's.
        side = keyed["backward" if phase in ("backward", "checkpoint") else "forward"]
        side[_COLLECTIVES[op][0]] = side.get(_COLLECTIVES[op][0], 0) + count
    rows = []
    for (op, phase), (count, size) in calls.items():
        row = {"op": op, "key": _COLLECTIVES[op][0], "phase": phase, "group": "0", "count": count, "bytes": size}
        if len(phases) == 3:  # schema 1 keeps the group's size here; 2 in commdebug.groups
            row["group_size"] = world_size
        rows.append(row)
    return {
        "collectives_forward": [[k, c] for k, c in keyed["forward"].items()],
        "collectives_backward": [[k, c] for k, c in keyed["backward"].items()],
        "commdebug_node": {
            "bytes": {p: sum(b for (_, ph), (_, b) in calls.items() if ph == p) for p in phases},
            "counts": {p: sum(c for (_, ph), (c, _) in calls.items() if ph == p) for p in phases},
            "collectives": rows,
        },
    }


def _event(index: int, step: int, phase: str, module: str, call: _Call, group: GroupInfo,
           start_s: float, latency_scale: float) -> CollectiveEvent:
    key, aten_op, busbw = _COLLECTIVES[call.op]
    in_shape, out_shape = list(call.shape), list(call.shape)
    rule = shape_rule(call.op)
    if rule is not None and rule.whole is not None:  # S is the whole side; the other is 1/n of it
        (in_shape if rule.part == "input" else out_shape)[-1] //= group.size
    size = _nbytes(call.shape)
    return CollectiveEvent(
        index=index, op=call.op, key=key, aten_op=aten_op, step=step, phase=phase, module=module,
        group=group, seq=index, dtype="bfloat16",  # one process group: its sequence is the index
        input_shapes=(tuple(in_shape),) if call.shape else (),
        output_shapes=(tuple(out_shape),) if call.shape else (),
        input_bytes=_nbytes(in_shape), output_bytes=_nbytes(out_shape),
        size_bytes=size, busbw_factor=busbw(group.size),
        dtensor_op=call.dtensor_op, placements=call.placements,
        mesh=_mesh(group.size) if call.dtensor_op else None,
        source=f"train.py:{40 + list(_COLLECTIVES).index(call.op)}",
        latency_s=(20e-6 + size / 100e9) * latency_scale, start_s=round(start_s, 9),
    )


def _event_v1(e: CollectiveEvent) -> dict:
    """Schema 1's event object: the group inline, no fields added since."""
    d = e.to_dict()
    d["group"] = {"name": e.group.name, "size": e.group.size, "ranks": list(e.group.ranks or ())}
    for name in ("peer", "p2p_seq", "microbatch", "start_s", "in_flight", "error", "unit"):
        del d[name]
    return d


def plant_late(dump: dict, late: dict[int, tuple[int, float]]) -> dict:
    """Make ranks arrive late, as a real job shows it: `late` maps a step to (rank, seconds):
    that rank comes to the step's first call (its barrier) `seconds` late, its gap before it
    that much longer, and every other member of its group waits for it inside the call (its
    latency that much longer) and goes on that much later. `dump`: one rank's (schema 2, from
    :func:`transformer_dump`), changed in place and returned."""
    section = dump["commdebug"]
    rank = section["metadata"]["rank"]
    columns = section["events"]["columns"]
    members = next(iter(section["groups"].values()))["ranks"]
    starts, lats = columns["start_s"], columns["latency_s"]
    for step, (late_rank, seconds) in sorted(late.items()):
        if late_rank not in members or step not in columns["step"]:
            continue
        i = columns["step"].index(step)
        if rank != late_rank:
            lats[i] += seconds  # it waited inside the call
            i += 1
        for j in range(i, len(starts)):  # everything after comes that much later on its own clock
            starts[j] = round(starts[j] + seconds, 9)
    return dump


def rank_dumps(ranks: int = 4, layers: int = 2, steps: int = 1, *, world_size: int = 8,
               odd_rank: int | None = None, odd_module: str | None = None,
               late: dict[int, tuple[int, float]] | None = None, **kw: Any) -> Iterator[tuple[int, dict]]:
    """(rank, dump) for each rank of a job of `ranks` ranks running the same model in groups of
    `world_size` (min(ranks, world_size)), one at a time. Each rank's latencies differ a little
    (rank r is 1 + r / 50 times slower), and rank `odd_rank` issues `odd_module`'s first
    call twice as large: a mismatch `commdebug check` reports. `late`: ranks that arrive late
    at a step's first call (:func:`plant_late`)."""
    tp = min(world_size, ranks)
    for r in range(ranks):
        dump = transformer_dump(layers, steps, world_size=tp, rank=r, job_size=ranks,
                                odd_module=odd_module if r == odd_rank else None,
                                latency_scale=1 + r / 50, **kw)
        yield r, plant_late(dump, late) if late else dump


def write_rank_dumps(folder: str | os.PathLike[str], ranks: int = 4, layers: int = 2, steps: int = 1,
                     **kw: Any) -> list[pathlib.Path]:
    """Write :func:`rank_dumps` as `folder`/rank<R>.json, as a job's ranks would; the paths."""
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, dump in rank_dumps(ranks, layers, steps, **kw):
        path = out / f"rank{r}.json"
        path.write_text(json.dumps(dump, separators=(",", ":")), encoding="utf-8")
        paths.append(path)
    return paths


def to_reference(dump: dict) -> dict:
    """What torch's CommDebugMode writes for the same run: no `commdebug` keys, op rows repeated
    once per call instead of counted."""
    ref = copy.deepcopy(dump)
    ref.pop("commdebug", None)
    stack = [ref]
    while stack:
        node = stack.pop()
        node.pop("commdebug_node", None)
        node.pop("operations_optimizer", None)  # ours: the reference has no optimizer phase
        for key in ("operations_forward", "operations_backward", "operations_checkpointing"):
            node[key] = [dict(r) for r in node.get(key, []) for _ in range(r.pop("count", 1))]
        stack.extend(node["children"])
    return ref
