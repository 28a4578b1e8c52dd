"""Which engine drives each GPU: the one that serves the model fastest there.

A GPU that more than one installed engine can drive (a CUDA box with MLX and a CUDA
build of llama.cpp; a Mac with MLX and llama.cpp's Metal build) gets the engine
whose stored profile (``tandem profile``, or what a serve worker measured at its
start and kept: workers/profiles.py) serves a reference request fastest. Where
not every engine has a profile for this device and model, the prior order of
launcher/devices.py decides (measured on an H200: llama.cpp's CUDA build first),
and the choice says so. ``--engine`` overrides both.

Pure given its ``profiles`` lookup, so tests choose on fake measurements.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem.launcher.devices import Device

# The reference request a choice is priced on: the seed preset's shape (a 512-token
# prompt, 128 tokens out), served alone and as one of a full batch. Decode dominates
# it (prefill on a GPU is 10-100x faster), as it dominates serving.
REF_PROMPT_TOKENS, REF_OUTPUT_TOKENS = 512, 128
ENGINES = ("llama.cpp", "mlx")

# (engine, profile device label such as "gpu-cuda", model file name) -> (prefill tok/s,
# decode tok/s by batch size), or None where nothing is stored.
ProfileLookup = Callable[[str, str, str], "tuple[float, list[float]] | None"]


@dataclass(frozen=True)
class Choice:
    """The engine chosen for one GPU, why, and the per-engine scores it compared
    (reference requests served per second at the worker's max active; empty when
    the prior or ``--engine`` decided)."""

    device: str  # the device's label: cuda:0, metal:0
    engine: str
    why: str
    scores: dict[str, float]

    def line(self) -> str:
        return f"{'engine':<8} {self.device} {self.engine}: {self.why}"


def ref_requests_per_s(prefill_tok_s: float, decode_tok_s: list[float], batch: int) -> float:
    """Reference requests a second at ``batch`` concurrent requests: each request's
    prefill alone, then its share of a ``batch``-row decode (the last known rate
    past the profile's end)."""
    if prefill_tok_s <= 0 or not decode_tok_s:
        return 0.0
    rate = decode_tok_s[min(batch, len(decode_tok_s)) - 1]
    if rate <= 0:
        return 0.0
    seconds = REF_PROMPT_TOKENS / prefill_tok_s + batch * REF_OUTPUT_TOKENS / rate
    return batch / seconds


def score(prefill_tok_s: float, decode_tok_s: list[float], max_active: int) -> float:
    """One number per engine, higher is faster: the geometric mean of reference
    requests a second alone and at ``max_active`` (a lone user's latency and a
    burst's throughput weigh alike)."""
    alone = ref_requests_per_s(prefill_tok_s, decode_tok_s, 1)
    full = ref_requests_per_s(prefill_tok_s, decode_tok_s, max(1, max_active))
    return (alone * full) ** 0.5


def profile_device(d: Device) -> str:
    """The device label a worker of ``d`` stores its profile under (its backend's
    ``device``): gpu-cuda, gpu-metal."""
    return f"gpu-{d.kind}"


def choose(
    d: Device, model: str, max_active: int, profiles: ProfileLookup, forced: str | None = None
) -> Choice:
    """The engine for GPU ``d`` serving the model file named ``model``."""
    if forced:
        if forced not in d.engines:
            have = ", ".join(d.engines) or "none"
            raise ValueError(f"--engine {forced}: {d.label} can be driven by {have} here")
        return Choice(d.label, forced, "--engine", {})
    scores: dict[str, float] = {}
    for engine in d.engines:
        got = profiles(engine, profile_device(d), model)
        if got is not None:
            scores[engine] = round(score(got[0], got[1], max_active), 3)
    missing = [e for e in d.engines if e not in scores]
    if len(d.engines) == 1:
        return Choice(d.label, d.backend, "the only engine installed for it", scores)
    if not missing:
        best = max(d.engines, key=lambda e: scores[e])  # ties: the prior's order
        shown = ", ".join(f"{e} {scores[e]:.2f}" for e in d.engines)
        why = f"fastest by the stored profiles (reference requests/s: {shown})"
        return Choice(d.label, best, why, scores)
    why = (f"{d.backend} is faster on {d.kind} GPUs where measured (no stored profile of "
           f"{', '.join(missing)} here to compare: `tandem profile --backend "
           f"{missing[0]} --device gpu` makes one)")  # fmt: skip
    return Choice(d.label, d.backend, why, scores)


def apply(
    found: list[Device],
    model: str,
    max_active: int,
    profiles: ProfileLookup,
    forced: str | None = None,
) -> tuple[list[Device], list[Choice]]:
    """``found`` with each GPU's backend the chosen engine, and the choices made."""
    if forced and forced not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)} or auto, not {forced!r}")
    out, choices = [], []
    for d in found:
        if not d.gpu:
            out.append(d)
            continue
        c = choose(d, model, max_active, profiles, forced)
        choices.append(c)
        out.append(dataclasses.replace(d, backend=c.engine))
    return out, choices


def record(choices: list[Choice], folder: Path) -> None:
    """The choices, in the run folder (engines.json): what serve chose and on what."""
    doc = {c.device: {"engine": c.engine, "why": c.why, "scores": c.scores} for c in choices}
    (folder / "engines.json").write_text(json.dumps(doc, indent=2) + "\n")
