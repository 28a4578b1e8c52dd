"""Named bench presets. ``seed``: the reference experiment of the article tandem is built on.

The article (Qwen2.5-0.5B on an Apple M2, a CPU and a Metal worker, each up to 4
active requests): a ~512-token prefix seeded into both workers' caches; every
request sends the same 516-token prompt (prefix + short tail) and generates
exactly 128 tokens (EOS ignored); arrivals 50 ms apart, open loop; bursts of 8
and 48; a fresh cluster per run, 3 runs; forced-GPU against mixed routing.
Without ``--worker`` the preset runs sim workers with the article's measured
rates (the bundled sim profiles cpu-m2 and gpu-m2); on a real machine name the
real workers, e.g. ``--worker llama.cpp:threads=8 --worker mlx:device=gpu``.
``forced:@fastest`` is forced-GPU whatever the workers are called.
"""

from __future__ import annotations

from typing import Any

from tandem.broker.policies import DEFAULT_POLICY

PRESETS: dict[str, dict[str, Any]] = {
    "seed": {
        "workers": ("sim:cpu-m2", "sim:gpu-m2"),
        "policies": ("forced:@fastest", DEFAULT_POLICY),
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
