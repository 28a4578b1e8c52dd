"""min / median / max of ab.sh's runs per side: usage ab_summary.py DIR TAG [SESSION]
(the files rb-SESSION-TAG-SIDE-N.json; SESSION s12 unless given)"""

import glob
import json
import statistics
import sys

folder, tag = sys.argv[1], sys.argv[2]
session = sys.argv[3] if len(sys.argv) > 3 else "s12"
for side in ("old", "new"):
    rows = []
    for f in sorted(glob.glob(f"{folder}/rb-{session}-{tag}-{side}-*.json")):
        with open(f) as fh:
            r = json.load(fh)["runs"][0]
        paths = r["paths"]
        rows.append({
            "req/s": paths["router"]["req_s"],
            "tok/s": paths["router"]["tok_s"],
            "added p50 ms": paths["router"]["p50_ms"] - paths["direct"]["p50_ms"],
            "router p50 ms": paths["router"]["p50_ms"],
            "relay p50 ms": paths["relay"]["p50_ms"],
            "direct p50 ms": paths["direct"]["p50_ms"],
            "decision at 256 ms": r["decision_ms"]["256"],
            "idle cpu %": r["swarm"]["cpu_pct"],
        })  # fmt: skip
    if not rows:
        continue
    print(side, len(rows), "runs")
    for key in rows[0]:
        xs = [row[key] for row in rows]
        lo, mid, hi = min(xs), statistics.median(xs), max(xs)
        print(f"  {key:20s} {lo:12.3f} {mid:12.3f} {hi:12.3f}   {[round(x, 3) for x in xs]}")
