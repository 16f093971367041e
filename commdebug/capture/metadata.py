"""Facts about the run a recording belongs to: rank, world size, backend, host, versions, times,
and the run identity that tells the ranks of one launch from those of another."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["run_metadata", "launcher_placement", "distributed_metadata", "run_id", "now"]

# where the ranks of one job agree on a run identity, in the job's own store
_RUN_ID_KEY = "commdebug/run_id"
_RUN_ID_CLAIM = "commdebug/run_id_claim"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def run_metadata() -> dict[str, Any]:
    """The metadata a recording starts with (``distributed_metadata`` fills in the rest once
    the program has set up torch.distributed)."""
    from commdebug.version import __version__

    meta: dict[str, Any] = {
        "rank": 0,
        "world_size": 1,
        "backend": None,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "torch_version": torch.__version__,
        "commdebug_version": __version__,
        "start_time": now(),
        "end_time": None,
        "steps": 0,
    }
    meta.update(launcher_placement(os.environ))
    meta.update(distributed_metadata(meta))
    return meta


def launcher_placement(env: Mapping[str, str]) -> dict[str, int]:
    """Where the launcher put this process: ``local_rank``, ``local_world_size`` and
    ``node_rank`` from torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK, where set. A
    folder of one node's dumps is told apart from a job with ranks missing by them
    (docs/ranks.md, one job from several folders).

    >>> launcher_placement({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    {'local_rank': 1, 'local_world_size': 2, 'node_rank': 1}
    """
    keys = (("local_rank", "LOCAL_RANK"), ("local_world_size", "LOCAL_WORLD_SIZE"), ("node_rank", "GROUP_RANK"))
    return {key: int(env[name]) for key, name in keys if env.get(name, "").isdigit()}


def distributed_metadata(known: dict[str, Any]) -> dict[str, Any]:
    """Rank, world size, backend and run id from torch.distributed, if it is initialised (the
    run id is asked for once: ``known`` is the metadata so far)."""
    if not (dist.is_available() and dist.is_initialized()):
        return {}
    out: dict[str, Any] = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}
    if "run_id" not in known:  # None (unknown) is an answer too: the store is asked once
        out["run_id"] = run_id()
    return out


def run_id() -> str | None:
    """An identity shared by every rank of one launch and by no other launch.

    ``COMMDEBUG_RUN_ID`` if set; else, once torch.distributed is initialised, an id the ranks
    agree on through the job's own store (the first rank to ask writes it; torchrun's
    ``TORCHELASTIC_RUN_ID`` is its prefix when one was given), which also holds for ranks
    started with ``torch.multiprocessing.spawn``; None where there is no real store (the fake
    backend: one process pretending to be one rank of many)."""
    env = os.environ.get("COMMDEBUG_RUN_ID", "").strip()
    if env:
        return env
    if not (dist.is_available() and dist.is_initialized()) or str(dist.get_backend()) == "fake":
        return _env_run_id()
    try:
        store = dist.distributed_c10d._get_default_store()
        if store.add(_RUN_ID_CLAIM, 1) == 1:  # atomic: exactly one rank writes the id
            elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
            prefix = f"{elastic}-" if elastic and elastic != "none" else ""
            store.set(_RUN_ID_KEY, f"{prefix}{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}")
        store.wait([_RUN_ID_KEY], timedelta(seconds=30))
        return store.get(_RUN_ID_KEY).decode()
    except Exception:  # a store that cannot do this (or is gone): the launcher's id, if any
        return _env_run_id()


def _env_run_id() -> str | None:
    env = os.environ.get("COMMDEBUG_RUN_ID", "").strip()
    if env:
        return env
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return elastic if elastic and elastic != "none" else None
