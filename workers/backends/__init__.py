"""Worker backends, registered by name; each module holds one engine's backend class.

Every backend class implements ``workers.engine.Backend`` and one constructor from
the worker's configuration, ``from_config(cfg, model_path)``. Modules are imported
only when their backend is used: llama.cpp and MLX are optional installs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tandem.workers.config import BACKENDS, WorkerConfig

if TYPE_CHECKING:
    from tandem.workers.engine import Backend

__all__ = ["BACKENDS", "BackendClass", "backend_class", "build_backend"]


class BackendClass(Protocol):
    """A registered backend class: its one constructor from the worker's configuration."""

    def from_config(self, cfg: WorkerConfig, model: Path) -> Backend: ...


# name -> "module:class"
_REGISTRY = {
    "llama.cpp": "tandem.workers.backends.llama:LlamaBackend",
    "mlx": "tandem.workers.backends.mlx.backend:MlxBackend",
    "sim": "tandem.workers.backends.sim:SimBackend",
}


def backend_class(name: str) -> BackendClass:
    """The class registered as ``name`` (ValueError names the known ones)."""
    if name not in _REGISTRY:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    module, cls = _REGISTRY[name].split(":")
    found: BackendClass = getattr(importlib.import_module(module), cls)
    return found


def build_backend(cfg: WorkerConfig) -> Backend:
    """Load the configured backend on the configured (or embedded default) model."""
    from tandem.common.model_files import resolve_model

    model = resolve_model(cfg.model)  # a path, a Hugging Face name, or the embedded default
    backend: Backend = backend_class(cfg.backend).from_config(cfg, model)
    return backend
