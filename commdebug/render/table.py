"""The text table: the reference's layout (indented module tree, one section per phase), plus bytes."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from commdebug.model.trace import PHASES, CollectiveStat, Trace, check_noise_level, ops_at_noise
from commdebug.units import format_duration, format_known_bytes

if TYPE_CHECKING:
    from commdebug.analysis.predicted import TracePredictions

__all__ = ["render_table", "light_note"]

_SECTIONS = tuple(zip(PHASES, ("FORWARD PASS", "BACKWARD PASS", "ACTIVATION CHECKPOINTING", "OPTIMIZER STEP"), strict=True))
_YELLOW, _RED, _RESET = "\033[1;33m", "\033[1;31m", "\033[0m"


def _stdout_wants_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def render_table(trace: Trace, noise_level: int = 3, *, color: bool | None = None,
                 predicted: TracePredictions | None = None) -> str:
    """Render a trace as the tracing table.

    Noise levels: 0 collective counts per module; 1 adds module types, parameter placements and
    DTensor ops; 2 adds all non-trivial ops; 3 all ops. Each collective line shows its count,
    total message size and process group (one line per group). A dump written by torch's
    CommDebugMode has neither bytes nor groups, and its lines show counts only.
    ``color=None`` colours only when stdout is a terminal.

    ``predicted`` (:func:`commdebug.analysis.predicted.trace_predictions`) adds, at noise level
    1 and above, each collective line's predicted time on that cluster. Level 0 stays exactly the
    reference's layout, whatever is passed. A light capture (docs/capture.md) starts levels 1-3
    with a line saying on which steps op rows and DTensor ops were recorded (:func:`light_note`);
    a recording of compiled code with what it could not attribute (``metadata.compile_notes``),
    and each line issued by compiled code says so, "(compiled)".

    >>> print(render_table(comm.trace, noise_level=0))   # doctest: +SKIP
    Global
      FORWARD PASS
        *c10d_functional.all_reduce: 2 (64.00 KiB) on mesh_tp[4]
    """
    check_noise_level(noise_level)
    if color is None:
        color = _stdout_wants_color()
    yellow, red, reset = (_YELLOW, _RED, _RESET) if color else ("", "", "")
    if noise_level < 1:
        predicted = None
    lines: list[str] = []
    # level 0 shows no op rows, so it has nothing a light capture lacks (level 1 shows the
    # DTensor ops, which light steps lack); a full capture stays byte-identical to the reference's
    note = light_note(trace.metadata) if noise_level >= 1 else None
    if note:
        lines.append(note)
    if noise_level >= 1:
        lines.extend(trace.metadata.get("compile_notes") or [])
    units = trace.units() if noise_level >= 1 else {}
    compiled = trace.compiled() if noise_level >= 1 else {}
    for fqn, depth in trace.walk():
        info = trace.modules[fqn]
        indent = "  " * (2 * depth)
        lines.append(f"{indent}{fqn}")
        if noise_level >= 1:
            if info.module_type:
                lines.append(f"{indent}*module type: {info.module_type}")
            if info.parameters:
                lines.append(f"{indent}*Parameter List")
                lines.extend(f"{indent} *{name}: {placement}" for name, placement in info.parameters.items())
        coll_indent = "  " * (2 * depth + 2)
        op_indent = "  " * (2 * depth + 3)
        for phase, title in _SECTIONS:
            stats = trace.collective_stats(fqn, phase)
            rows = ops_at_noise(trace.operations(fqn, phase), noise_level)
            if not stats and not rows:
                continue
            lines.append(f"{indent}  {title}")
            for stat in stats:
                size = f" ({format_known_bytes(stat.bytes, stat.unknown)})" if trace.bytes_recorded else ""
                on = f" on {stat.group.label}" if stat.group.name != "?" else ""
                pred = _predicted(predicted, fqn, phase, stat) if predicted is not None else ""
                n = compiled.get((fqn, phase, stat.key, stat.group.name))
                mark = "" if not n else " (compiled)" if n == stat.count else f" ({n} compiled)"
                lines.append(f"{yellow}{coll_indent}*{stat.key}: {stat.count}{size}{on}{mark}{pred}{reset}")
                unit = units.get((fqn, phase, stat.key, stat.group.name))
                if unit and set(unit) != {fqn}:  # FSDP2 prefetches: another module's parameters
                    lines.append(f"{coll_indent}  FSDP units of its own calls: {', '.join(f'{u} x{n}' for u, n in unit.most_common())}")
            for row in rows:
                times = f" x{row.count}" if row.count > 1 else ""
                lines.append(f"{yellow}{coll_indent}**{row.name}{times}{reset}")
                if row.input_shape:
                    lines.append(f"{red}{op_indent}shape: [{', '.join(row.input_shape)}]{reset}")
                    lines.append(f"{red}{op_indent}sharding: [{', '.join(row.input_sharding)}]{reset}")
                    lines.append(f"{red}{op_indent}device mesh: {row.device_mesh}{reset}")
    return "\n".join(lines) + "\n"


def _predicted(predicted: TracePredictions, fqn: str, phase: str, stat: CollectiveStat) -> str:
    """``, predicted 43.2 us on h100-ib400`` for a line, with ``(3 of 4 calls)`` when only some
    of its calls were predicted (older ones dropped, a group of unknown size); empty if none."""
    line = predicted.line(fqn, phase, stat.key, stat.group.name)
    if line is None:
        return ""
    part = f" ({line.calls} of {stat.count} calls)" if line.calls < stat.count else ""
    return f", predicted {format_duration(line.seconds)} on {predicted.cluster.name}{part}"


def light_note(facts: Mapping[str, Any]) -> str | None:
    """What a light capture lacks and where it has it, from a dump's metadata or a summary's
    header (the same keys: ``capture``, ``detail_every``, ``detail_steps``); None for a full one.

    >>> light_note({"capture": "light", "detail_every": 10, "detail_steps": [0, 10, 20]})
    'light capture: operation rows and DTensor ops only on detail steps 0, 10, 20 (detail_every=10)'
    >>> light_note({"capture": "light", "detail_every": None, "detail_steps": []})
    'light capture: no operation rows or DTensor ops (no detail steps)'
    """
    if facts.get("capture") != "light":
        return None
    every = facts.get("detail_every")
    every_text = f"detail_every={every}" if isinstance(every, int) else ""
    listed = facts.get("detail_steps")
    steps = sorted(s for s in listed if isinstance(s, int)) if isinstance(listed, list) else []
    if not steps:
        return f"light capture: no operation rows or DTensor ops (no detail steps{'; ' + every_text if every_text else ''})"
    return f"light capture: operation rows and DTensor ops only on detail steps {_steps(steps)}{f' ({every_text})' if every_text else ''}"


def _steps(steps: list[int]) -> str:
    """``0, 10, 20`` or, for a long run, ``0, 100, 200, ..., 9900 (100 steps)``: one line."""
    if len(steps) <= 6:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:3]))}, ..., {steps[-1]} ({len(steps)} steps)"
