"""The twin's yardstick with the GPU's tail of slow steps priced — an estimate.

A copy of a bench result with the GPU's served decode rates divided by the factor
a run of its steps cost over the median step in this folder's step-gap.json
(the median over its rows: 1.05 at 8 rows, used up to 8; 1.12 at 16, used above),
for `tandem bench twin-oracle` to search the best placement on:

    python docs/results/h200/matrix-warm6/tail_priced.py \
        docs/results/h200/matrix-warm6/burst48-active16/result.json /tmp/tail16/result.json
    tandem bench twin-oracle /tmp/tail16/result.json --out /tmp/tail16
"""

import json
import sys
from pathlib import Path

RUN_OVER_MEDIAN = {8: 1.05, 16: 1.12}  # step-gap.json: mean / median, median over rows


def factor(batch: int) -> float:
    return RUN_OVER_MEDIAN[8] if batch <= 8 else RUN_OVER_MEDIAN[16]


def main(src: str, dst: str) -> None:
    result = json.loads(Path(src).read_text())
    for group in result["groups"]:
        for key in ("twin_served", "twin_served_from", "twin_served_alone"):
            group.pop(key, None)
        for case in group["cases"]:
            for run in case["runs"]:
                run.pop("twin_oracle", None)
                gpu = run.get("served_rates", {}).get("gpu")
                if gpu:
                    gpu["decode_tok_s"] = [
                        x / factor(b) for b, x in enumerate(gpu["decode_tok_s"], 1)
                    ]
    Path(dst).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
