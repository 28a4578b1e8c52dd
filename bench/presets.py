"""Named bench presets. ``seed``: the reference experiment of the article tandem is built on.

The article (Qwen2.5-0.5B on an Apple M2, a CPU and a Metal worker, each up to 4
active requests): a ~512-token prefix seeded into both workers' caches; every
request sends the same 516-token prompt (prefix + short tail) and generates
exactly 128 tokens (EOS ignored); arrivals 50 ms apart, open loop; bursts of 8
and 48; a fresh cluster per run, 3 runs; forced-GPU against mixed routing.
Without ``--worker`` the preset runs sim workers with the article's measured
rates (deploy/profiles/cpu-m2.json, gpu-m2.json); on a real machine name the
real workers, e.g. ``--worker llama.cpp:threads=8 --worker mlx:device=gpu``.
``forced:@fastest`` is forced-GPU whatever the workers are called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROFILES = Path(__file__).resolve().parents[1] / "deploy" / "profiles"
if PROFILES.is_relative_to(Path.cwd()):  # shorter in reports when run from the repo root
    PROFILES = PROFILES.relative_to(Path.cwd())

PRESETS: dict[str, dict[str, Any]] = {
    "seed": {
        "workers": (f"sim:{PROFILES / 'cpu-m2.json'}", f"sim:{PROFILES / 'gpu-m2.json'}"),
        "policies": ("forced:@fastest", "phase_cost"),
        "workload": "burst",
        "requests": (8, 48),
        "spacing_ms": 50.0,
        "hit_mix": (1.0,),
        "prefix_tokens": 512,
        "prompt_tokens": 516,
        "output_tokens": 128,
        "same_prompt": True,
        "max_active": 4,
        "runs": 3,
    },
}
