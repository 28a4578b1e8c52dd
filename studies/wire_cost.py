"""What encoding and decoding the router's hot frames costs, this tree against another.

``python studies/wire_cost.py --before DIR`` times, in process, ``p.encode`` and
``p.decode`` of the frames the router reads and writes most (a token delta, a step's
deltas, a Submit, an Assign, a Done, a heartbeat), here and in ``DIR`` (a tree laid
out as the installed package: ``DIR/tandem/common/protocol.py``; made with
``git archive``), in alternating child processes so that both see the same machine.
Prints microseconds per call (the median of ``--rounds`` rounds) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

ROUND_S = 0.2  # each timing loop runs about this long


def frames(p: Any) -> dict[str, Any]:
    """The hot messages, built with what both trees accept."""
    stats = {"prompt_tokens": 512, "cached_tokens": 256, "output_tokens": 64,
             "worker_queue_s": 0.001, "prefill_s": 0.05, "decode_s": 1.2, "worker": "cpu0",
             "queue_s": 0.002, "ttft_s": 0.06, "e2e_s": 1.3, "policy": "phase_cost",
             "router_cached_estimate": 256}  # fmt: skip
    done_stats = p.DoneStats(**stats) if hasattr(p, "DoneStats") else stats
    rows = [p.RequestRow(f"e.{i:x}", 512, 256, 0, 60) for i in range(8)]
    if hasattr(p, "CacheReport"):
        cache = p.CacheReport(full=False, seq=8, base=7, added=[1 << 40], removed=[])
    else:
        cache = {"full": False, "base": 7, "seq": 8, "added": [1 << 40], "removed": []}
    ids = [f"e.{i:x}" for i in range(64)]
    return {
        "tokens": p.TokenDelta("e.1f", [1234], " the"),
        "step_tokens_64": p.StepTokens(ids, [[1000 + i] for i in range(64)], [" a"] * 64),
        "submit": p.Submit("r-1", tokens=list(range(64)), sampling=p.SamplingParams(64)),
        "assign_512": p.Assign("e.1f", list(range(512)), p.SamplingParams(64, seed=3)),
        "accepted": p.Accepted("r-1", "cpu0", 512, 256),
        "done": p.Done("e.1f", p.FinishReason.LENGTH, done_stats),
        "heartbeat_8": p.Heartbeat("cpu0", 9, rows, [], 4096, 8192, cache),
    }


def per_call_us(fn: Any, arg: Any) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(200):
            fn(arg)
        n += 200
        elapsed = time.perf_counter() - t0
        if elapsed >= ROUND_S:
            return elapsed / n * 1e6


def child() -> None:
    """One round in this process: {name: [encode us, decode us]} as JSON."""
    from tandem.common import protocol as p

    out = {}
    for name, msg in frames(p).items():
        frame = p.encode(msg)
        assert p.decode(frame) == msg, name
        out[name] = [per_call_us(p.encode, msg), per_call_us(p.decode, frame)]
    print(json.dumps(out))


def run(tree: str | None) -> dict[str, list[float]]:
    # This file's functions, run in a child against this tree's protocol or DIR's.
    code = "import sys; sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None; "
    code += f"exec(open({__file__!r}).read().split('# --' + '-- main')[0]); child()"
    here = [sys.executable, "-c", code, tree or ""]
    done = subprocess.run(here, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


# ---- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a tree with tandem/ (git archive)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rounds: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        rounds["before"].append(run(args.before))
        rounds["after"].append(run(None))
    print(f"{'frame':16} {'enc before':>10} {'enc after':>10} {'ratio':>6} "
          f"{'dec before':>10} {'dec after':>10} {'ratio':>6}  (us per call, median)")  # fmt: skip
    for name in rounds["after"][0]:
        med = {k: [statistics.median(r[name][i] for r in v) for i in (0, 1)]
               for k, v in rounds.items()}  # fmt: skip
        (eb, db), (ea, da) = med["before"], med["after"]
        encode = f"{eb:10.2f} {ea:10.2f} {ea / eb:6.2f}"
        print(f"{name:16} {encode} {db:10.2f} {da:10.2f} {da / db:6.2f}")


if __name__ == "__main__":
    main()
