"""The prefix cache on the Mooncake trace, in the twin: today's cache, the memory-sized
default, eviction by value against LRU, and the per-worker bound.

    python studies/cache_study.py --limit 1000 --limit 0 --out /tmp/cache-study

Lengths / 16 and outputs / 4 (bench/trace.py), real arrival times, one H200 fleet
(``sim:h200-gpu`` and ``sim:h200-cpu``, their profiles' memory: workers/memory.py
sizes each cache as the real worker would), the default policy. Per run: the
fraction of prompt tokens served from a prefix cache, TTFT and E2E, and two bounds
on that fraction: the *per-worker bound* (each worker with an unlimited cache, the
requests placed where the run placed them) and the *global bound* (one unlimited
cache for all). Writes rows.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tandem.bench.driver import RequestRecord
from tandem.bench.stats import percentile
from tandem.bench.trace import TraceScale
from tandem.bench.workload import PromptBook, Workload
from tandem.common.blocks import block_hashes
from tandem.twin.cache import CacheSpec
from tandem.twin.replay import TwinWorkerSpec, replay
from tandem.workers.device_model import SimProfile

TRACE = str(Path(__file__).resolve().parents[2] / "shared/traces/mooncake_synthetic.jsonl")
FLEET = ("h200-gpu", "h200-cpu")
BLOCK = 16  # the engine's block size (EngineConfig)
# name -> the cache flags of every worker ("today": the defaults before sizing by memory)
CONFIGS: dict[str, CacheSpec] = {
    "today": CacheSpec(cache_tokens=4096, cache_entries=16, cache_policy="lru", host_cache_mem=0),
    "default": CacheSpec(),
    "default-lru": CacheSpec(cache_policy="lru"),
}
CAPACITIES = (16384, 131072, 524288)  # eviction where a cache binds: value vs lru, no host tier


def constrained() -> dict[str, CacheSpec]:
    return {
        f"{policy}-{cap // 1024}k": CacheSpec(
            cache_tokens=cap, cache_policy=policy, host_cache_mem=0
        )  # fmt: skip
        for cap in CAPACITIES
        for policy in ("value", "lru")
    }


def bounds(recs: Sequence[RequestRecord], prompts: dict[int, list[int]]) -> tuple[float, float]:
    """(per-worker, global) fraction of prompt tokens an unlimited cache would serve:
    each prompt's leading blocks already seen (on its worker / anywhere), leaving one
    token to compute as the engine does."""
    seen: dict[str, set[int]] = {}
    everywhere: set[int] = set()
    per = glob = total = 0
    for r in sorted(recs, key=lambda r: (r.submit_s, r.index)):
        prompt = prompts[r.index]
        hashes = block_hashes(prompt, BLOCK)
        usable = hashes[: (len(prompt) - 1) // BLOCK]
        mine = seen.setdefault(r.worker or "", set())
        per += _leading(usable, mine) * BLOCK
        glob += _leading(usable, everywhere) * BLOCK
        total += len(prompt)
        mine.update(hashes)
        everywhere.update(hashes)
    return per / total, glob / total


def _leading(hashes: list[int], held: set[int]) -> int:
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


def run_one(
    name: str,
    spec: CacheSpec,
    limit: int,
    encode: Any,
    policy: str,
    trace: str = TRACE,
    fleet: Sequence[str] = FLEET,
) -> dict[str, Any]:
    wl = Workload(kind="trace", trace=trace, output_tokens=1,
                  trace_scale=TraceScale(16.0, 4.0, 1.0, limit))  # fmt: skip
    arrivals = wl.arrivals(0)
    book = PromptBook(encode, wl)
    specs = [TwinWorkerSpec(f, SimProfile.load(f), 8, cache=spec) for f in fleet]
    t = time.perf_counter()
    rep = replay(specs, policy, arrivals, book, seed_prefix=False)
    prompts = {a.index: book.prompt(a) for a in arrivals}
    recs = [r for r in rep.records if r.done_s is not None and r.token_s]
    cached = sum(int(r.stats.get("cached_tokens", 0)) for r in recs)
    total = sum(len(prompts[r.index]) for r in recs)
    per, glob = bounds(recs, prompts)
    ttft = [r.token_s[0] - r.scheduled_s for r in recs]
    e2e = [r.done_s - r.scheduled_s for r in recs if r.done_s is not None]
    return {
        "config": name, "requests": len(arrivals), "served": len(recs), "policy": policy,
        "cached_frac": cached / total, "per_worker_bound": per, "global_bound": glob,
        "of_bound": cached / total / per if per else None,
        "ttft_mean_s": sum(ttft) / len(ttft), "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99), "e2e_mean_s": sum(e2e) / len(e2e),
        "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
        "makespan_s": max(r.done_s for r in recs if r.done_s) - min(r.scheduled_s for r in recs),
        "on": {w: sum(r.worker == w for r in recs) for w in fleet},
        "caches": rep.caches, "wall_s": time.perf_counter() - t,
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| requests | cache | cached | per-worker bound | of bound | global bound | "
            "TTFT mean / p99 s | E2E mean / p99 s | requests per worker |")  # fmt: skip
    out = [head, "|" + " --- |" * 9]
    for r in rows:
        on = "/".join(str(n) for n in r["on"].values())
        out.append(
            f"| {r['requests']} | {r['config']} | {100 * r['cached_frac']:.1f} % | "
            f"{100 * r['per_worker_bound']:.1f} % | {100 * (r['of_bound'] or 0):.0f} % | "
            f"{100 * r['global_bound']:.1f} % | {r['ttft_mean_s']:.3f} / {r['ttft_p99_s']:.2f} | "
            f"{r['e2e_mean_s']:.2f} / {r['e2e_p99_s']:.2f} | {on} |"
        )
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Cached fraction against the cache's size, value and LRU, one panel per trace
    length; the per-worker bound and the memory-sized default drawn across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = sorted({r["requests"] for r in rows})
    fig, axes = plt.subplots(1, len(limits), figsize=(4.2 * len(limits), 3.2), squeeze=False)
    for ax, n in zip(axes[0], limits, strict=True):
        mine = [r for r in rows if r["requests"] == n]
        for policy, style in (("value", "o-"), ("lru", "s--")):
            ours = [r for r in mine if r["config"].startswith(policy + "-") and _size(r["config"])]
            pts = sorted((_size(r["config"]), r["cached_frac"]) for r in ours)
            ax.plot([x for x, _ in pts], [100 * y for _, y in pts], style, label=policy)
        named = {r["config"]: r for r in mine}
        if "default" in named:
            ax.axhline(100 * named["default"]["per_worker_bound"], color="grey", ls=":",
                       label="per-worker bound")  # fmt: skip
            ax.axhline(100 * named["default"]["cached_frac"], color="green", lw=0.8,
                       label="default (memory-sized)")  # fmt: skip
        if "today" in named:
            ax.axhline(100 * named["today"]["cached_frac"], color="red", lw=0.8,
                       label="before (4,096 tokens, 16 entries)")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefix cache per worker (tokens)")
        ax.set_ylabel("prompt tokens from the cache (%)")
        ax.set_title(f"first {n} requests" if n < 3993 else f"all {n} requests", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _size(config: str) -> int:
    tail = config.rsplit("-", 1)[-1]
    return int(tail[:-1]) * 1024 if tail.endswith("k") and tail[:-1].isdigit() else 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, action="append", help="first N requests (0: all)")
    ap.add_argument("--config", action="append", help="only these configs")
    ap.add_argument("--policy", default="lookahead")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--fleet", default=",".join(FLEET), help="sim profiles, one worker each")
    ap.add_argument("--out", type=Path, default=Path("/tmp/cache-study"))
    ap.add_argument("--plot", type=Path, nargs="+", help="only plot these rows.json files")
    args = ap.parse_args(argv)
    if args.plot:
        rows = [r for f in args.plot for r in json.loads(f.read_text())]
        args.out.mkdir(parents=True, exist_ok=True)
        plot(rows, args.out / "cache-vs-size.png")
        print(table(rows))
        return
    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf

    encode = TextTokenizer(tokenizer_spec_from_gguf(default_model_path())).encode
    configs = {**CONFIGS, **constrained()}
    names = args.config or list(configs)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for limit in args.limit or [1000]:
        for name in names:
            fleet = args.fleet.split(",")
            rows.append(run_one(name, configs[name], limit, encode, args.policy, args.trace, fleet))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "caches"}), flush=True)
            (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
