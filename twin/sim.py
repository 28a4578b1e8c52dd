"""``tandem sim``: a whole bench (groups, policies, runs) replayed in the twin.

The config is the bench's own (``BenchConfig``, built from the same options),
the result document has the bench's shape (result.json, report.md, plots come
from bench/report.py and bench/plots.py), so a twin result reads like a bench
result and the two compare case by case (twin/validate.py). Differences: no
process starts, rates are the workers' advertised ones (the sim profiles are
exact), and the twin is deterministic, so the CV rule never adds runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tandem.bench import stats
from tandem.bench.experiment import POLICY_OPTIONS, BenchConfig, resolve_policy, run_record
from tandem.bench.run import finish_doc, new_doc
from tandem.bench.spec import WorkerArg
from tandem.bench.workload import PromptBook, Workload
from tandem.twin.cache import CacheSpec
from tandem.twin.replay import TwinWorkerSpec, replay
from tandem.twin.world import NO_DELAY, Links
from tandem.workers.device_model import SimProfile

_FLAG_FIELDS = {"--step-tokens": "step_tokens", "--heartbeat-s": "heartbeat_s"}


_CACHE_FLAGS = ("--cache-tokens", "--cache-entries", "--cache-mem-frac", "--cache-mem",
                "--host-cache-mem-frac", "--host-cache-mem", "--cache-policy")  # fmt: skip
# Every flag the twin models; any other is an error, never silently ignored.
_KNOWN = {"--profile", "--prefill-tok-s", "--decode-tok-s", "--join-s", *_FLAG_FIELDS,
          *_CACHE_FLAGS}  # fmt: skip


def twin_spec(w: WorkerArg, max_active: int) -> TwinWorkerSpec:
    """A bench ``--worker sim:...`` spec as a twin worker (only sim workers have a twin);
    ValueError names a key the twin does not model."""
    if w.backend != "sim":
        raise ValueError(f"worker {w.text!r}: the twin plays sim workers only")
    flags = dict(zip(w.flags[::2], w.flags[1::2], strict=True))
    unknown = sorted(k.removeprefix("--").replace("-", "_") for k in set(flags) - _KNOWN)
    if unknown:
        known = sorted(k.removeprefix("--").replace("-", "_") for k in _KNOWN | {"--id"})
        raise ValueError(f"worker {w.text!r}: the twin does not model {unknown} "
                         f"(it takes {known}, max_active and n_ctx)")  # fmt: skip
    if "--profile" not in flags:
        raise ValueError(f"worker {w.text!r}: name a sim profile")
    profile = SimProfile.load(flags["--profile"])
    prefill, decode = flags.get("--prefill-tok-s"), flags.get("--decode-tok-s")
    advertised = None
    if prefill or decode:
        advertised = (
            float(prefill) if prefill else profile.prefill_tok_s,
            tuple(float(x) for x in decode.split(",")) if decode else tuple(profile.decode_tok_s()),
        )
    extra: dict[str, Any] = {v: type_of(v)(flags[k]) for k, v in _FLAG_FIELDS.items() if k in flags}
    if "--join-s" in flags:
        extra["join_s"] = float(flags["--join-s"])
    if w.n_ctx:
        extra["n_ctx"] = w.n_ctx
    try:
        extra["cache"] = CacheSpec.from_flags({k: flags[k] for k in _CACHE_FLAGS if k in flags})
    except ValueError as exc:
        raise ValueError(f"worker {w.text!r}: {exc}") from None
    return TwinWorkerSpec(w.worker_id, profile, w.max_active or max_active, advertised, **extra)


def type_of(field: str) -> type:
    return int if field == "step_tokens" else float


def router_options(policy: str) -> tuple[str, dict[str, Any]]:
    """``POLICY[+OPTION...]`` (the bench's form) -> (policy, replay keyword arguments)."""
    base, *options = policy.split("+")
    kw: dict[str, Any] = {}
    for opt in options:
        if opt not in POLICY_OPTIONS:
            raise ValueError(f"policy {policy!r}: unknown option {opt!r}")
        if opt in ("calibrate", "static"):
            kw["calibrate"] = opt == "calibrate"
        else:
            kw["decode_estimate"] = "ratio"
    return base, kw


def advertised(specs: list[TwinWorkerSpec]) -> dict[str, dict[str, Any]]:
    """Rates as the bench's result records them (what the oracle bound uses)."""
    out = {}
    for s in specs:
        prefill, decode = s.advertised or (s.profile.prefill_tok_s, s.profile.decode_tok_s())
        decode = list(decode)[: s.max_active]
        out[s.worker_id] = {
            "prefill_tok_s": prefill,
            "decode_tok_s_1": decode[0],
            "decode_tok_s_peak": max(decode),
            "source": "advertised",
        }
    return out


def twin_case(
    specs: list[TwinWorkerSpec],
    wl: Workload,
    book: PromptBook,
    policy: str,
    run: int,
    seed: int,
    links: Links = NO_DELAY,
    ttft_slo_s: float | None = None,
) -> dict[str, Any]:
    """One run of one policy, recorded like a bench run (plus the twin's own counters)."""
    base, kw = router_options(policy)
    t = time.perf_counter()
    arrivals = wl.arrivals(seed + run)
    rep = replay(specs, base, arrivals, book, seed_prefix=wl.seeds_prefix, links=links, **kw)
    rates = advertised([s for s in specs if s.join_s is None] or specs)
    doc = run_record(rep.records, arrivals, book, wl, rates, [s.worker_id for s in specs],
                     rep.decisions, rep.seeds, run, False, ttft_slo_s)  # fmt: skip
    doc["twin"] = {"wall_s": time.perf_counter() - t, "events": rep.events}
    return doc


def run_sim(
    cfg: BenchConfig, encode: Any, out_dir: Path, command: str, links: Links = NO_DELAY
) -> dict[str, Any]:
    """Every group, policy and run of ``cfg`` in the twin; writes the bench's outputs."""
    doc = new_doc(cfg, command, twin=True)
    t_start = time.monotonic()
    for max_active in cfg.max_active:
        for wl in cfg.workloads:
            doc["groups"].append(_group(cfg, encode, wl, max_active, links))
    return finish_doc(doc, out_dir, t_start)


def _group(cfg: BenchConfig, encode: Any, wl: Workload, max_active: int, links: Links) -> dict:
    specs = [twin_spec(w, max_active) for w in cfg.workers]
    rates = advertised(specs)
    book = PromptBook(encode, wl)
    cases = []
    for policy in cfg.policies:
        router_policy = resolve_policy(policy, rates)
        runs = [
            twin_case(specs, wl, book, router_policy, run, cfg.seed, links, cfg.ttft_slo_s)
            for run in range(cfg.runs)
        ]
        cases.append(
            {
                "policy": policy,
                "router_policy": router_policy,
                "runs": runs,
                "extra_runs_added": False,
                "summary": stats.summarize_runs(runs),
            }
        )
    return {
        "label": f"{wl.label}-active{max_active}",
        "max_active": max_active,
        "workload": wl.to_json(),
        "rates": {"advertised": rates, "measured": None, "used": rates},
        "cases": cases,
    }
