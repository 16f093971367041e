"""The public :class:`CommDebugMode`: the recorder (:mod:`commdebug.capture`) with the drop-in
query and report methods of ``torch.distributed.tensor.debug.CommDebugMode`` on top. Capture
decides what happened; this class only asks the model, the analyses and the renderers about it.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

from commdebug import ops as _ops
from commdebug.analysis.predicted import trace_predictions
from commdebug.analysis.summary import summarize
from commdebug.capture.config import ConfigError
from commdebug.capture.recorder import Recorder
from commdebug.errors import CommDebugError
from commdebug.estimate import load_cluster
from commdebug.fileio import expand_placeholders, write_output
from commdebug.model.dump import dump_text
from commdebug.model.trace import BACKWARD, CHECKPOINT, GLOBAL, PHASES
from commdebug.render.summary import render_summary
from commdebug.render.table import render_table
from commdebug.render.verbose import VerboseLog

__all__ = ["CommDebugMode"]


class CommDebugMode(Recorder):
    """Record every collective a PyTorch program issues, by module, phase and step.

    A drop-in for ``torch.distributed.tensor.debug.CommDebugMode``: same methods, defaults and
    count keys, and it also works across many training steps, sees eager c10d ops
    (send/recv/barrier too), and records bytes, groups, sources and optional latency.

    Example::

        from commdebug import CommDebugMode

        comm = CommDebugMode()
        with comm:
            for step in range(3):
                model(inp).sum().backward()
                optimizer.step()          # marks a step boundary
        print(comm.generate_comm_debug_tracing_table(noise_level=0))
        comm.generate_json_dump("comm.json", noise_level=2)
        comm.get_comm_counts()[torch.ops.c10d_functional.all_reduce]

    Options (keyword-only; also from ``COMMDEBUG_*`` environment variables and config files,
    see :meth:`from_config` and docs/configuration.md):
        max_events: keep at most this many collective events (the oldest are dropped and
            counted); ``None`` keeps all. Aggregated counts and bytes are never dropped.
        record_source: record the user's ``file:line`` of each collective (turn off to keep
            file paths out of dumps you share).
        timing: ``False``/``"off"``; ``"events"``: CUDA events recorded around each collective
            and read once done, never waiting (on CPU, the host clock from the call to its
            Work's completion, or to the end of the program's own wait where there is no Work); ``"sync"``: wait for each collective and record its
            latency (CUDA events on CUDA), which serialises communication with compute, so it
            measures collectives, not whole steps; ``True``/``"auto"``: ``"sync"`` for blocking
            CPU calls (``async_op=False``, which wait anyway), ``"events"`` for the rest;
            ``"async"``: NCCL's own kernel timings, without waiting (other backends record none
            and say so once).
        auto_step: let ``optimizer.step()`` mark step boundaries; ``step()`` marks them by
            hand (both together count one boundary).
        ops: record only these collectives (``["all_reduce", "all_gather"]``; torch's and
            deepspeed.comm's names such as ``all_gather_into_tensor`` are understood).
        crossnode_only: record only collectives whose group spans more than one node, with
            ``ranks_per_node`` ranks per node (default: the launcher's ``LOCAL_WORLD_SIZE``).
        start_step, end_step: record only steps ``start_step <= step < end_step``; outside
            that window the mode is popped and the program runs at close to bare speed.
        verbose: log one line per collective to the ``commdebug`` logger (INFO).
        nvtx: on CUDA, wrap each collective in an NVTX range named with op, size, group and
            module, for Nsight.
        enabled: ``False`` makes the context do nothing (DeepSpeed's ``comms_logger.enabled``).
        cluster: a preset (``"h100-ib400"``) or cluster JSON file: summaries add each row's
            predicted time on it, the table each collective line's (noise levels 1-3), and the
            dump keeps it (``metadata.cluster``) so the reports of the file (summary, table,
            Chrome trace, viewer) predict too; computed when a report is made, never while
            recording (docs/estimate.md).
    """

    def _check_options(self) -> None:
        if self.options.cluster is not None:  # a typo fails when the mode is made, not at the report
            try:
                load_cluster(self.options.cluster)
            except CommDebugError as e:
                raise ConfigError(f"cluster: {e}") from None

    def __enter__(self) -> CommDebugMode:
        cluster = None if self.options.cluster is None else load_cluster(self.options.cluster).to_dict()
        super().__enter__()
        if cluster is not None:
            self.trace.metadata["cluster"] = cluster
        if self.options.enabled and self.options.verbose:
            self._listeners = [VerboseLog(int(self.trace.metadata["rank"]))]
        return self

    # ---- the reference's query API ----------------------------------------------------------

    def get_total_counts(self) -> int:
        """Number of collectives recorded."""
        return self.trace.totals()["collectives"]

    def get_comm_counts(self) -> dict[Any, int]:
        """Collective counts keyed like the reference: ``{torch.ops.c10d_functional.all_reduce: 2}``."""
        counts: dict[Any, int] = defaultdict(int)
        for phase in PHASES:
            for key, n in self.trace.collective_counts(GLOBAL, phase).items():
                counts[_ops.compat_key_packet(key)] += n
        return counts

    @property
    def comm_counts(self) -> dict[Any, int]:
        return self.get_comm_counts()

    @property
    def comm_module_counts(self) -> dict[str, dict[str, dict[Any, int]]]:
        """``{fqn: {"forward": {op: n}, "backward": {op: n}}}``, as the reference keeps it.

        As in the reference, ``backward`` includes activation-checkpoint recompute, and
        ``forward`` whatever ran outside backward, ``optimizer.step()`` included.
        """
        out: dict[str, dict[str, dict[Any, int]]] = {GLOBAL: {"forward": defaultdict(int), "backward": defaultdict(int)}}
        for (fqn, phase), bucket in self.trace.collectives.items():
            entry = out.setdefault(fqn, {"forward": defaultdict(int), "backward": defaultdict(int)})
            side = entry["backward" if phase in (BACKWARD, CHECKPOINT) else "forward"]
            for key, (count, *_) in bucket.items():
                side[_ops.compat_key_packet(key[0])] += count
        return out

    @property
    def comm_module_operation_counts(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """``{fqn: {"operations_list": [op dict, ...]}}``; identical ops appear once with ``count``."""
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for fqn, _ in self.trace.walk():
            rows = []
            for phase in PHASES:
                for r in self.trace.operations(fqn, phase):
                    rows.append(
                        {
                            "name": r.name,
                            "input_shape": list(r.input_shape),
                            "input_sharding": list(r.input_sharding),
                            "device_mesh": r.device_mesh,
                            "is_bw": phase in (BACKWARD, CHECKPOINT),
                            "is_activation_checkpointing": phase == CHECKPOINT,
                            "count": r.count,
                        }
                    )
            if rows:
                out[fqn] = {"operations_list": rows}
        return out

    def get_parameter_info(self) -> dict[str, dict[str, Any]]:
        """``{module fqn: {parameter name: parameter data}}`` for every module that ran."""
        return {fqn: {name: p.data for name, p in params.items()} for fqn, params in self._params.items()}

    def get_sharding_info(self) -> dict[str, Any]:
        """``{"Module.sub.weight": placements}`` for every DTensor parameter."""
        return self._sharding

    @property
    def advanced_module_tracker(self) -> _ReferenceTrackerView:
        """The reference's tracker dictionaries, for tests written against it."""
        return _ReferenceTrackerView(self)

    # ---- reports (formatting lives in commdebug.render, the dump's form in commdebug.model.dump) ----

    def generate_comm_debug_tracing_table(self, noise_level: int = 3, *, color: bool | None = None) -> str:
        """The module tree with collectives per phase; ops by noise level 0-3 (see README). With a
        cluster (``cluster=``), levels 1-3 add each collective line's predicted time on it."""
        return render_table(self.trace, noise_level, color=color, predicted=self._table_predictions(noise_level))

    def _table_predictions(self, noise_level: int) -> Any:
        """The table's predictions on this mode's cluster, computed now (when the table is asked
        for), never while recording; None at level 0 or without a cluster."""
        if noise_level < 1 or self.trace.metadata.get("cluster") is None:
            return None
        return trace_predictions(self.trace)

    def generate_summary_table(self, by: str = "op", *, header: bool = True) -> str:
        """Per-op (or per ``"op,size"``, ``"op,bin"``, ``"module"``, ``"group"``, ``"step"``,
        ``"phase"``) counts, bytes and, when timed, times and bandwidths, with a header giving
        elapsed and communication time (docs/summary.md). Same text as ``commdebug summary``;
        ``header=False`` leaves the header out, as ``--no-header`` does.

        >>> print(comm.generate_summary_table(by="op,size"))   # doctest: +SKIP
        """
        self._join_timing()
        if self._active:  # inside the context: how long so far
            self.trace.metadata["elapsed_s"] = time.perf_counter() - self._t0
            self.trace.metadata["recorded_s"] = self.recorded_so_far()
        return render_summary(summarize(self.trace, by), header=header)

    def log_comm_debug_tracing_table_to_file(self, file_name: str | os.PathLike = "comm_mode_log.txt", noise_level: int = 3) -> None:
        """Write the table, without colours, to ``file_name`` (atomically, folders created).

        ``{rank}`` and ``{world_size}`` in the name are replaced, so each rank writes its own:
        ``comm.log_comm_debug_tracing_table_to_file("logs/comm_rank{rank}.txt")``."""
        text = render_table(self.trace, noise_level, color=False, predicted=self._table_predictions(noise_level))
        write_output(self._file_name(file_name), text)

    def generate_json_dump(self, file_name: str | os.PathLike = "comm_mode_log.json", noise_level: int = 3) -> None:
        """Write the JSON dump (docs/json-format.md): the reference's format plus our section.

        ``{rank}`` and ``{world_size}`` in the name are replaced:
        ``comm.generate_json_dump("traces/rank{rank}.json")``."""
        write_output(self._file_name(file_name), dump_text(self.refresh(), noise_level))

    def _file_name(self, name: str | os.PathLike) -> str:
        self.refresh_metadata()
        meta = self.trace.metadata
        return expand_placeholders(name, int(meta.get("rank") or 0), int(meta.get("world_size") or 1))

    def __repr__(self) -> str:
        return f"CommDebugMode(get_total_counts()={self.get_total_counts()})"


class _ReferenceTrackerView:
    """Read-only dictionaries shaped like the reference's ``advanced_module_tracker``."""

    def __init__(self, mode: CommDebugMode) -> None:
        trace = mode.trace
        self.module_helper_dict: dict[str, dict[str, Any]] = {}
        self.parent_dict: dict[str, list[str]] = {}
        for fqn, depth in trace.walk():
            info = trace.modules[fqn]
            entry: dict[str, Any] = {"depth": depth}
            if fqn != GLOBAL:
                entry["module_type"] = info.module_type
            if info.parameters:
                entry["parameters"] = dict(info.parameters)
            self.module_helper_dict[fqn] = entry
            if info.children:
                self.parent_dict[fqn] = list(info.children)
        self.module_parameters_dict = mode.get_parameter_info()
        self.sharding_dict = mode.get_sharding_info()


