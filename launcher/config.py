"""``tandem serve``'s configuration: one TOML file, flags over it, written back out.

    model = "ORG/NAME-GGUF:Q4_K_M"   # or a path; unset: the embedded default
    devices = "auto"                 # or "cpu", "gpu", "cpu,cuda:1", ...
    engine = "auto"                  # each GPU's engine: auto (fastest measured), llama.cpp, mlx
    listen = "0.0.0.0"               # other hosts may attach workers (tandem join)
    [router]                         # any `tandem router` flag: policy = "finish_time"
    [gateway]                        # any `tandem gateway` flag: port = 8000
    [worker]                         # any `tandem worker` flag, for every local worker
    [[workers]]                      # the workers, when not one per device found:
    worker_id = "cpu0"               #   `tandem worker` flags, plus env = {...}
    [[workers]]
    worker_id = "gpu-box"            #   or a worker that attaches from another host
    remote = true

A key is the flag's long name with ``_`` for ``-`` (``--max-active`` is
``max_active``); an on/off flag is a boolean. Unknown keys are refused by name.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

TOP_KEYS = ("model", "devices", "engine", "keys", "run_dir", "listen", "join_addr")
SECTIONS = ("router", "gateway", "worker", "workers")
WORKER_EXTRA = ("remote", "env")  # serve's own keys of a [[workers]] entry


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``tandem serve`` starts; values are the processes' flags by key."""

    model: str | None = None
    devices: str = "auto"
    engine: str = "auto"  # the GPUs' engine: auto (launcher/engines.py), llama.cpp or mlx
    keys: str | None = None  # CURVE keys folder, for every process
    run_dir: str | None = None  # logs; default: a new folder under the cache root
    # Other hosts: the host the router's worker socket and the join service bind (None:
    # as [router] worker_addr says, loopback by default), and the join service's address.
    listen: str | None = None
    join_addr: str | None = None
    router: dict[str, Any] = field(default_factory=dict)
    gateway: dict[str, Any] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)  # every local worker's flags
    workers: tuple[dict[str, Any], ...] = ()  # empty: one worker per device found

    def with_flags(self, top: dict[str, Any], sections: dict[str, dict[str, Any]]) -> ServeConfig:
        """This config with command-line values over it (None: not given). A worker
        flag overrides the file's value for every worker, listed ones included."""
        given = {k: v for k, v in top.items() if v is not None}
        knobs = sections.get("worker", {})
        return replace(
            self,
            **given,
            router={**self.router, **sections.get("router", {})},
            gateway={**self.gateway, **sections.get("gateway", {})},
            worker={**self.worker, **knobs},
            workers=tuple({k: v for k, v in w.items() if k not in knobs} for w in self.workers),
        )


def load(path: str | Path) -> ServeConfig:
    """Read a config file; ValueError names the file and what is wrong in it."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config {path}: {exc}") from None
    try:
        return from_dict(data)
    except ValueError as exc:
        raise ValueError(f"config {path}: {exc}") from None


def from_dict(data: dict[str, Any]) -> ServeConfig:
    """A ServeConfig from parsed TOML; unknown top-level keys and sections refused
    here, unknown flags in a section by the plan (it knows each command's flags)."""
    for key, value in data.items():
        if key not in TOP_KEYS + SECTIONS:
            known = ", ".join(TOP_KEYS + SECTIONS)
            raise ValueError(f"unknown key {key!r} (known: {known})")
        table = key in SECTIONS[:3]
        if table and not isinstance(value, dict):
            raise ValueError(f"[{key}] must be a table")
        if key == "workers" and not (
            isinstance(value, list) and all(isinstance(w, dict) for w in value)
        ):
            raise ValueError("workers must be an array of tables ([[workers]])")
        if key in TOP_KEYS and not isinstance(value, str):
            raise ValueError(f"{key} must be a string")
    return ServeConfig(**{**data, "workers": tuple(data.get("workers", ()))})


def dumps(cfg: ServeConfig) -> str:
    """The config as TOML that ``load`` reads back to an equal config. Its shape is
    flat (scalars, lists, one level of inline tables), so a few lines write it
    rather than a dependency."""
    lines = [f"{k} = {_value(getattr(cfg, k))}" for k in TOP_KEYS if getattr(cfg, k) is not None]
    for name in ("router", "gateway", "worker"):
        table = getattr(cfg, name)
        if table:
            lines += ["", f"[{name}]", *_pairs(table)]
    for w in cfg.workers:
        lines += ["", "[[workers]]", *_pairs(w)]
    return "\n".join(lines) + "\n"


def _pairs(table: dict[str, Any]) -> list[str]:
    return [f"{k} = {_value(v)}" for k, v in table.items() if v is not None]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else "nan" if v != v else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise ValueError(f"cannot write {v!r} ({type(v).__name__}) to TOML")
