"""Stored worker profiles: measured rates per backend/device/model, kept on disk.

``tandem profile`` writes them; a worker starting without rate flags advertises
the last profile for its backend, device and model.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from tandem.common.model_files import cache_root

log = logging.getLogger(__name__)


def profile_path(backend: str, device: str, model: str) -> Path:
    safe = "-".join(x.replace("/", "_").replace(" ", "_") for x in (backend, device, model))
    return cache_root() / "profiles" / f"{safe}.json"


def save_profile(backend: str, device: str, model: str, data: dict[str, Any]) -> Path:
    path = profile_path(backend, device, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return path


def profile_model(backend: Any) -> str:
    """The model part of a backend's profile key: its file's name, and the format it
    serves the weights in when it converted them (llama_weights.py: ``NAME@q8_0``), whose
    rates are not the file's."""
    fmt = getattr(backend, "weights_format", "")
    return f"{backend.model_name}@{fmt}" if fmt else str(backend.model_name)


def stored_rates(backend: Any) -> tuple[float, list[float]] | None:
    """(prefill tok/s, decode tok/s by batch size) from the stored profile, if any."""
    return read_rates(backend.name, backend.device, profile_model(backend))


def read_rates(backend: str, device: str, model: str) -> tuple[float, list[float]] | None:
    """(prefill tok/s, decode tok/s by batch size) stored for these, if any."""
    path = profile_path(backend, device, model)
    try:
        data = json.loads(path.read_text())
        return float(data["prefill_tok_s"]), [float(x) for x in data["decode_tok_s"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable profile %s: %s", path, exc)
        return None


def keep_start_rates(backend: Any, prefill: float, decode: list[float], how: str) -> None:
    """Store what a worker measured at its start as its profile, where none is stored
    (``--keep-profile``: what tandem serve's workers do), so that its next start
    registers at once and tandem serve can compare engines (launcher/engines.py).
    A stored profile is never replaced: ``tandem profile`` writes a fuller one."""
    if stored_rates(backend) is not None:
        return
    doc = {"prefill_tok_s": prefill, "decode_tok_s": decode, "source": how,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    try:
        path = save_profile(backend.name, backend.device, profile_model(backend), doc)
    except OSError as exc:  # a read-only cache: the worker serves all the same
        log.warning("cannot keep the start-up measurement as a profile: %s", exc)
        return
    log.info("kept the start-up measurement as the profile %s", path)
