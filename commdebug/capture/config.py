"""CommDebugMode's options: one definition, read from keyword arguments, a dict or JSON file
(ours, or DeepSpeed's ``comms_logger`` block as is) and ``COMMDEBUG_*`` environment variables.

Precedence, lowest first: defaults, environment, config file or dict, keyword arguments. Every
bad key or value is one :class:`ConfigError` that names it.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from commdebug import ops as _ops
from commdebug.errors import CommDebugError

__all__ = ["Options", "ConfigError", "ENV_PREFIX", "NCCL_HOOK_ENV", "TIMING_MODES", "SESSION_OPTIONS", "canonical_ops", "check_option"]

ENV_PREFIX = "COMMDEBUG_"
# "auto" (what True means): "sync" for blocking CPU calls, "events" for the rest (timekeeping.py)
TIMING_MODES = ("off", "auto", "events", "sync", "async")


class ConfigError(CommDebugError, ValueError):
    """A bad option: unknown key, wrong type or value out of range. The message names the key."""


@dataclass(frozen=True)
class Options:
    """What CommDebugMode records. See docs/configuration.md for each field."""

    enabled: bool = True
    max_events: int | None = 20_000
    record_source: bool = True
    timing: str = "off"
    auto_step: bool = True
    ops: frozenset[str] | None = None
    crossnode_only: bool = False
    ranks_per_node: int | None = None
    start_step: int = 0
    end_step: int | None = None
    verbose: bool = False
    nvtx: bool = False
    cluster: str | None = None
    light: bool = False
    detail_every: int | None = None
    # a recording session's (commdebug run, the start-up hook); the mode itself ignores them
    stream: bool = True
    keep_steps: int | None = None
    metrics_port: int | None = None
    metrics_push: str | None = None  # a Pushgateway's URL: each rank's final metrics go there at exit
    debug_server: int | None = None
    profile_steps: tuple[int, int] | None = None  # torch.profiler over these steps (launch/profiling.py)

    @property
    def plain(self) -> bool:
        """Nothing to do around a collective but record it: no filter, timer or NVTX range."""
        return self.ops is None and not self.crossnode_only and self.timing == "off" and not self.nvtx

    @classmethod
    def resolve(cls, kwargs: Mapping[str, Any], config: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Options:
        """Defaults, then ``COMMDEBUG_*`` from ``env`` (``os.environ`` when None), then
        ``config`` (see :func:`read_config`), then ``kwargs``; validated."""
        options = cls()
        values: dict[str, Any] = {}
        values.update(_from_env(os.environ if env is None else env))
        if config:
            values.update(config)
        values.update(kwargs)
        for key, value in values.items():
            options = replace(options, **{key: _check(key, value)})
        if options.end_step is not None and options.end_step <= options.start_step:
            raise ConfigError(f"end_step ({options.end_step}) must be greater than start_step ({options.start_step})")
        if options.detail_every is not None and not options.light:
            # detail on every Nth step means light on the others
            options = replace(options, light=True)
        if options.crossnode_only and options.ranks_per_node is None:
            raise ConfigError("crossnode_only needs ranks_per_node (or LOCAL_WORLD_SIZE set by the launcher)")
        return options

    @property
    def windowed(self) -> bool:
        return self.start_step > 0 or self.end_step is not None


# ---- values -------------------------------------------------------------------------------------


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{key} must be true or false, got {value!r}")


def _int(key: str, value: Any, minimum: int, allow_none: bool = False) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        if allow_none:
            return None
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    try:
        number = int(value) if isinstance(value, (int, str)) else None
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}{' or null' if allow_none else ''}, got {value!r}")
    return number


def _timing(key: str, value: Any) -> str:
    if value is True:
        return "auto"
    if value is False or value is None:
        return "off"
    text = str(value).strip().lower()
    text = {"1": "auto", "true": "auto", "on": "auto", "yes": "auto", "0": "off", "false": "off", "no": "off", "": "off"}.get(text, text)
    if text not in TIMING_MODES:
        raise ConfigError(f"{key} must be one of {', '.join(TIMING_MODES)} (or true/false), got {value!r}")
    return text


def _cluster(key: str, value: Any) -> str | None:
    """A preset name or cluster file (CommDebugMode loads it when the mode is made, so a typo
    fails then)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{key} must be a preset name or a cluster JSON file, got {value!r}")
    return os.fspath(value)


def canonical_ops(names: Any, key: str = "ops") -> frozenset[str]:
    """Op names (ours, torch.distributed's or deepspeed.comm's) as canonical names."""
    if isinstance(names, str):
        names = [n for n in names.replace(";", ",").split(",") if n.strip()]
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{key} must be a list of collective names, got {names!r}")
    out = set()
    for name in names:
        op = _ops.canonical_op(name.strip(), source="torch")
        if op is None:
            known = ", ".join(sorted(_ops.accepted_names("torch")))
            raise ConfigError(f"{key}: unknown collective {name!r} (known: {known})")
        out.add(op)
    return frozenset(out)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "enabled": _bool,
    "max_events": lambda k, v: _int(k, v, 0, allow_none=True),
    "record_source": _bool,
    "timing": _timing,
    "auto_step": _bool,
    "ops": lambda k, v: None if v is None else canonical_ops(v, k),
    "crossnode_only": _bool,
    "ranks_per_node": lambda k, v: _int(k, v, 1, allow_none=True),
    "start_step": lambda k, v: _int(k, v, 0),
    "end_step": lambda k, v: _int(k, v, 1, allow_none=True),
    "verbose": _bool,
    "nvtx": _bool,
    "cluster": _cluster,
    "light": _bool,
    "detail_every": lambda k, v: _int(k, v, 1, allow_none=True),
    "stream": _bool,
    "keep_steps": lambda k, v: _int(k, v, 1, allow_none=True),
    "metrics_port": lambda k, v: _port(k, v),
    "metrics_push": lambda k, v: _url(k, v),
    "debug_server": lambda k, v: _port(k, v),
    "profile_steps": lambda k, v: _step_range(k, v),
}
assert set(_CHECKS) == {f.name for f in fields(Options)}
# options of a recording session (docs/streaming.md, docs/metrics.md, docs/debug-server.md)
SESSION_OPTIONS = frozenset({"stream", "keep_steps", "metrics_port", "metrics_push", "debug_server", "profile_steps"})


def _step_range(key: str, value: Any) -> tuple[int, int] | None:
    """``"3-5"``, ``"4"``, ``[3, 5]`` -> (3, 5), (4, 4), (3, 5): steps from A to B, both included.

    >>> _step_range("profile_steps", "3-5"), _step_range("profile_steps", "4")
    ((3, 5), (4, 4))
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    rule = f"{key} must be A-B or A (steps, whole numbers >= 0), got {value!r}"
    if isinstance(value, str):
        parts = value.strip().split("-")
        if not 1 <= len(parts) <= 2 or not all(p.strip().isdigit() for p in parts):
            raise ConfigError(rule)
        numbers = [int(p) for p in parts]
    elif isinstance(value, (list, tuple)) and 1 <= len(value) <= 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        numbers = list(value)
    else:
        raise ConfigError(rule)
    if numbers[-1] < numbers[0]:
        raise ConfigError(f"{key} {value!r}: the last step comes before the first")
    return numbers[0], numbers[-1]


def _port(key: str, value: Any) -> int | None:
    port = _int(key, value, 1, allow_none=True)
    if port is not None and port > 65535:
        raise ConfigError(f"{key} must be a TCP port, 1-65535, got {value!r}")
    return port


def _url(key: str, value: Any) -> str | None:
    """An http(s) URL with a host (``http://`` when no scheme is given), or None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = value.strip() if isinstance(value, str) else ""
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018  # a port that is not a number raises here
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key} must be an http(s) URL such as http://pushgateway:9091, got {value!r}")
    return url


def check_option(key: str, value: Any) -> Any:
    """One option's value, checked and converted as from a config file; a :class:`ConfigError` naming it."""
    return _check(key, value)


def _check(key: str, value: Any) -> Any:
    check = _CHECKS.get(key)
    if check is None:
        raise ConfigError(f"unknown option {key!r} (known: {', '.join(_CHECKS)})")
    return check(key, value)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``COMMDEBUG_TIMING=sync`` -> ``{"timing": "sync"}``; ``LOCAL_WORLD_SIZE`` (torchrun) is
    the default ranks per node. ``COMMDEBUG`` and ``COMMDEBUG_OUT`` belong to ``commdebug run``."""
    values: dict[str, Any] = {}
    if env.get("LOCAL_WORLD_SIZE", "").isdigit():
        values["ranks_per_node"] = int(env["LOCAL_WORLD_SIZE"])
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name in _LAUNCHER_VARS:
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key not in _CHECKS:
            raise ConfigError(f"unknown environment variable {name} (known: {', '.join(ENV_PREFIX + k.upper() for k in _CHECKS)})")
        try:
            values[key] = _check(key, text)
        except ConfigError as e:
            raise ConfigError(f"{name}: {e}") from None
    return values


# variables that are no option: read by the launcher (commdebug run and the start-up hook), the
# run id (metadata.py), and the opt-in to NCCL's completion hook (timing.py)
NCCL_HOOK_ENV = "COMMDEBUG_NCCL_COMPLETION_HOOK"
_LAUNCHER_VARS = frozenset({"COMMDEBUG_OUT", "COMMDEBUG_HANG_TIMEOUT", "COMMDEBUG_HTML", "COMMDEBUG_RUN_ID", NCCL_HOOK_ENV})


# ---- config files -----------------------------------------------------------------------------

_DEEPSPEED_KEYS = {"enabled", "verbose", "prof_all", "prof_ops", "debug"}


def read_config(config: Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """Options from a dict or a JSON file: our keys at the top level, or a DeepSpeed config
    whose ``comms_logger`` block is read as is (the rest of a DeepSpeed config is DeepSpeed's).

    DeepSpeed's logger times every collective by synchronising, so ``enabled`` there means
    ``timing="sync"``; ``prof_all: false`` records only ``prof_ops``; ``debug`` records the
    caller's source line.
    """
    if not isinstance(config, Mapping):
        path = Path(config)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read: {e}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config file holds a JSON object")
        config = data
    if "comms_logger" in config:
        return _from_deepspeed(config["comms_logger"])
    for key in config:
        if key not in _CHECKS:
            raise ConfigError(f"unknown option {key!r} (known: {', '.join(_CHECKS)}; or a DeepSpeed 'comms_logger' block)")
    return dict(config)


def _from_deepspeed(block: Any) -> dict[str, Any]:
    if not isinstance(block, Mapping):
        raise ConfigError(f"comms_logger must be an object, got {block!r}")
    for key in block:
        if key not in _DEEPSPEED_KEYS:
            raise ConfigError(f"comms_logger: unknown key {key!r} (known: {', '.join(sorted(_DEEPSPEED_KEYS))})")
    enabled = _bool("comms_logger.enabled", block.get("enabled", False))
    out: dict[str, Any] = {"enabled": enabled, "timing": "sync" if enabled else "off"}
    if "verbose" in block:
        out["verbose"] = _bool("comms_logger.verbose", block["verbose"])
    if "debug" in block:
        out["record_source"] = _bool("comms_logger.debug", block["debug"])
    prof_all = _bool("comms_logger.prof_all", block.get("prof_all", True))
    if not prof_all:
        out["ops"] = canonical_ops(block.get("prof_ops", []), "comms_logger.prof_ops")
    elif "prof_ops" in block:
        canonical_ops(block["prof_ops"], "comms_logger.prof_ops")  # still check the names
    return out
