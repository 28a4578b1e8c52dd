"""Pick MLX's CUDA graph setting from two ``tandem profile --json`` logs.

    python3 studies/gpu-box/pick_knob.py DEFAULT_LOG GRAPHS0_LOG

Exit 0 when the graphs-off profile decodes at least 5 % faster (geometric mean over
batch sizes) without losing more than 10 % of prefill; 1 otherwise (keep MLX's
default); 2 when a log holds no profile. Prints both profiles and the verdict.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

MIN_DECODE_GAIN = 1.05
MAX_PREFILL_LOSS = 0.90


def last_profile(path: str) -> dict | None:
    lines = Path(path).read_text(errors="replace").splitlines() if Path(path).exists() else []
    for line in reversed(lines):
        if line.startswith("{"):
            return json.loads(line)
    return None


def main(default_log: str, graphs0_log: str) -> int:
    on, off = last_profile(default_log), last_profile(graphs0_log)
    if on is None or off is None:
        print(f"no profile in {default_log if on is None else graphs0_log}")
        return 2
    for name, doc in (("graphs on (default)", on), ("graphs off", off)):
        print(f"{name}: prefill {doc['prefill_tok_s']:.0f} tok/s, decode {doc['decode_tok_s']}")
    ratios = [b / a for a, b in zip(on["decode_tok_s"], off["decode_tok_s"], strict=True)]
    gain = math.exp(sum(map(math.log, ratios)) / len(ratios))
    prefill = off["prefill_tok_s"] / on["prefill_tok_s"]
    pick = gain >= MIN_DECODE_GAIN and prefill >= MAX_PREFILL_LOSS
    print(f"graphs off / on: decode x{gain:.2f} (geo-mean), prefill x{prefill:.2f}")
    print("chosen: MLX_USE_CUDA_GRAPHS=0" if pick else "chosen: MLX default (graphs on)")
    return 0 if pick else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
