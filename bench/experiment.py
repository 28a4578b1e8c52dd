"""Run a bench: every (max_active, workload) group, every policy, every run.

Per group the workers' rates are measured once (bench/calibrate.py) in a
cluster of their own. Then each run of each policy gets a fresh cluster: start
router + workers, seed the prefix into every worker, run the workload, stop.
With ``reuse_workers`` a group's workers start once and serve every run; each run
still gets a fresh router with its policy (the workers re-register with it). That
measures a server that has been serving: the workers' step-time models hold what
earlier runs measured (a fresh worker has only its warm-up), and a GPU worker's
start (kernels, warm-up: most of a run's device time) is paid once per group.
Each run ends with the router's priced rates (``served``) for a second oracle bound.
Runs are interleaved across policies (run 1 of every policy, then run 2, ...)
so slow drift on a shared machine hits every policy alike. Runs are never
discarded; if a headline figure's CV exceeds 5 %, two more runs are added (once).
The result document is rewritten after every run, so an interrupted bench
keeps what it measured.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.bench import stats
from tandem.bench.calibrate import (
    advertised_rates,
    measure_rates,
    served_rates,
    to_worker_rates,
)
from tandem.bench.driver import RequestRecord, run_arrivals, seed_workers
from tandem.bench.oracle import Job, oracle_bound
from tandem.bench.records import decisions_json, record_json
from tandem.bench.spec import WorkerArg
from tandem.bench.workload import Arrival, PromptBook, Workload
from tandem.broker.decisions import read_decisions
from tandem.launcher.cluster import Cluster, WorkerSpec

RATE_SOURCES = ("measured", "advertised")
ORACLE_MAX_JOBS = 400  # longer runs (traces) get no oracle bound
# A simulated CPU's prefill step lasts up to 3.5 s (256 tokens at 73 tok/s); the
# router's default 3 s liveness once expired such a worker mid-seed. Expiry is not
# what the bench measures, so it gets a wider margin.
ROUTER_ARGS = ["--liveness-s", "10"]
_SYMBOLIC = {"@fastest": max, "@slowest": min}  # forced:@fastest = highest prefill rate
# Router options a bench policy may carry as suffixes: ``phase_cost+static`` prices by
# the advertised rates alone (the router calibrates by default).
POLICY_OPTIONS = {
    "calibrate": ["--calibrate"],
    "static": ["--no-calibrate"],
    "ratio": ["--decode-estimate", "ratio"],
}


def router_policy_args(policy: str) -> list[str]:
    """``POLICY[+OPTION...]`` -> the router's flags; ValueError on an unknown option."""
    base, *options = policy.split("+")
    flags = ["--policy", base]
    for opt in options:
        if opt not in POLICY_OPTIONS:
            raise ValueError(
                f"policy {policy!r}: unknown option {opt!r} (have {sorted(POLICY_OPTIONS)})"
            )
        flags += POLICY_OPTIONS[opt]
    return flags


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    workers: tuple[WorkerArg, ...]
    workloads: tuple[Workload, ...]
    policies: tuple[str, ...]
    max_active: tuple[int, ...] = (4,)
    runs: int = 3
    rates: str = "measured"  # what the oracle bound is computed from
    transport: str = "ipc"
    keep_token_times: bool = False
    seed: int = 0
    timeout_s: float = 900.0  # silence tolerated per request (a forced-CPU queue is long)
    heartbeat_s: float = 0.5
    preset: str | None = None
    router_cpus: str | None = None  # `tandem router --cpus`: keep it off the workers' cores
    ttft_slo_s: float = 2.0  # goodput: requests whose first token came within this
    reuse_workers: bool = False  # one set of workers per group, a fresh router per run

    def __post_init__(self) -> None:
        if not self.workers or not self.workloads or not self.policies:
            raise ValueError("need workers, workloads and policies")
        if self.runs < 1 or min(self.max_active) < 1:
            raise ValueError("runs and max_active must be >= 1")
        if self.rates not in RATE_SOURCES:
            raise ValueError(f"rates must be one of {RATE_SOURCES}")
        if self.ttft_slo_s <= 0:
            raise ValueError("ttft_slo_s must be > 0")
        if self.transport not in ("ipc", "tcp"):
            raise ValueError("transport must be ipc or tcp")
        for policy in self.policies:
            router_policy_args(policy)

    def to_json(self) -> dict[str, Any]:
        return {
            "workers": [{"spec": w.text, "id": w.worker_id} for w in self.workers],
            "workloads": [w.to_json() for w in self.workloads],
            "policies": list(self.policies),
            "max_active": list(self.max_active),
            "runs": self.runs,
            "rates": self.rates,
            "transport": self.transport,
            "seed": self.seed,
            "preset": self.preset,
            "ttft_slo_s": self.ttft_slo_s,
            "reuse_workers": self.reuse_workers,
            "cv_rule": {"headline": list(stats.HEADLINE), "limit": stats.CV_LIMIT},
        }


def n_ctx_for(wl: Workload, max_active: int) -> int:
    """KV cells: every active request's prompt + output, plus the prefix cache's budget."""
    need = max_active * wl.max_request_tokens() + 4096
    return max(8192, -(-need // 1024) * 1024)


def resolve_policy(policy: str, rates: dict[str, dict[str, float]]) -> str:
    """``forced:@fastest`` / ``forced:@slowest``: the worker with the highest / lowest
    prefill rate (the GPU / the CPU in a mixed cluster); other policies as given."""
    kind, _, sel = policy.partition(":")
    sel, plus, options = sel.partition("+")
    if kind == "forced" and sel in _SYMBOLIC:
        pick = _SYMBOLIC[sel](rates, key=lambda w: rates[w]["prefill_tok_s"])
        return f"forced:{pick}{plus}{options}"
    return policy


@contextmanager
def running_cluster(
    specs: list[WorkerSpec], router_args: list[str], transport: str
) -> Iterator[Cluster]:
    """A started cluster, stopped on exit (workers first, then the router)."""
    cl = Cluster(workers=specs, router_args=router_args, transport=transport, start_timeout_s=300.0)
    try:
        cl.start()
        yield cl
    finally:
        cl.__exit__(None, None, None)


class Bench:
    """One bench invocation: its config, its result document, its progress bar."""

    def __init__(self, cfg: BenchConfig, encode: Callable[[str], list[int]], doc: dict) -> None:
        self.cfg = cfg
        self.encode = encode
        self.doc = doc
        self.ids = [w.worker_id for w in cfg.workers]
        self._shared: Cluster | None = None  # the group's workers, with reuse_workers

    def router_pinning(self) -> list[str]:
        return ["--cpus", self.cfg.router_cpus] if self.cfg.router_cpus else []

    def active_of(self, w: WorkerArg, max_active: int) -> int:
        """A spec's own max_active always wins: a sweep varies the workers that name none
        (``--worker llama.cpp:max_active=4 --worker mlx --sweep-max-active 1,2,4`` sweeps
        the GPU with the CPU held at 4)."""
        return w.max_active or max_active

    def specs(self, wl: Workload, max_active: int) -> list[WorkerSpec]:
        return [
            w.cluster_spec(
                self.active_of(w, max_active),
                n_ctx_for(wl, self.active_of(w, max_active)),
                self.cfg.heartbeat_s,
            )
            for w in self.cfg.workers
        ]

    @contextmanager
    def group_workers(self, wl: Workload, max_active: int) -> Iterator[None]:
        """With ``reuse_workers``: the group's workers, started once, serve every run
        inside (each with a router of its own, ``cluster``); else nothing."""
        if not self.cfg.reuse_workers:
            yield
            return
        router = ["--policy", "least_loaded", *ROUTER_ARGS, *self.router_pinning()]
        with running_cluster(self.specs(wl, max_active), router, self.cfg.transport) as cl:
            cl.kill("router", signal.SIGTERM)  # each run starts its own
            self._shared = cl
            try:
                yield
            finally:
                self._shared = None

    @contextmanager
    def cluster(self, wl: Workload, max_active: int, router: list[str]) -> Iterator[Cluster]:
        """A cluster whose router runs with ``router``'s flags, for one run: fresh, or
        the group's workers with a new router (stopped on exit: its log is complete)."""
        cl = self._shared
        if cl is None:
            with running_cluster(self.specs(wl, max_active), router, self.cfg.transport) as fresh:
                yield fresh
            return
        if "router" in cl.procs:  # a run that failed midway left it running
            cl.kill("router", signal.SIGTERM)
        cl.router_args = router
        cl.start_router()
        try:
            cl.wait_for_workers(set(self.ids))
            yield cl
        finally:
            if "router" in cl.procs:
                cl.kill("router", signal.SIGTERM)

    def calibrate(self, wl: Workload, max_active: int) -> dict[str, Any]:
        """Advertised and (unless rates=advertised) measured rates of every worker."""
        book = PromptBook(self.encode, wl)
        # calibration requests are pinned to their worker: least_loaded only breaks ties
        router = ["--policy", "least_loaded", *ROUTER_ARGS, *self.router_pinning()]
        with self.cluster(wl, max_active, router) as cl:
            with cl.client() as c:
                advertised = advertised_rates(c.status().workers)
            if self.cfg.rates == "advertised":
                return {"advertised": advertised, "measured": None, "used": advertised}
            seeds = asyncio.run(seed_workers(cl.client_addr, self.ids, book.prefix, 600.0))
            hit = book.prompt(Arrival(0, 0.0, True))
            batch = {w.worker_id: self.active_of(w, max_active) for w in self.cfg.workers}
            measured = measure_rates(
                cl.client_addr, seeds, hit, batch, wl.output_tokens, self.cfg.timeout_s
            )
        return {"advertised": advertised, "measured": measured, "used": measured}

    def run_once(
        self, wl: Workload, max_active: int, policy: str, run: int, rates: dict
    ) -> dict[str, Any]:
        """One fresh cluster: seed, run the workload, stop; the run's whole record."""
        book = PromptBook(self.encode, wl)
        arrivals = wl.arrivals(self.cfg.seed + run)
        with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
            log = Path(tmp) / "decisions.jsonl"
            router = [*router_policy_args(policy), "--decision-log", str(log), *ROUTER_ARGS]
            router += self.router_pinning()
            with self.cluster(wl, max_active, router) as cl:
                seeds = (
                    asyncio.run(seed_workers(cl.client_addr, self.ids, book.prefix, 600.0))
                    if wl.seeds_prefix
                    else {}
                )
                recs = asyncio.run(
                    run_arrivals(
                        cl.client_addr, arrivals, book, wl.output_tokens, self.cfg.timeout_s
                    )
                )
                with cl.client() as c:
                    served = served_rates(c.status().workers)
            decisions = list(read_decisions(log)) if log.exists() else []
        return run_record(recs, arrivals, book, wl, rates, self.ids, decisions, seeds,
                          run, self.cfg.keep_token_times, self.cfg.ttft_slo_s,
                          served=served)  # fmt: skip


def run_record(
    recs: list[RequestRecord],
    arrivals: list[Arrival],
    book: PromptBook,
    wl: Workload,
    rates: dict,
    worker_ids: list[str],
    decisions: list[dict[str, Any]],
    seeds: dict[str, dict[str, Any]],
    run: int,
    keep_token_times: bool,
    ttft_slo_s: float | None = None,
    served: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One run's whole record from what the client saw (the bench's and the twin's);
    ``served``: the rates the router priced with at the run's end (a second bound)."""
    t0 = min(r.submit_s for r in recs)
    jobs = [
        Job(
            r.submit_s,
            max(1, len(book.prompt(a)) - int(r.stats.get("cached_tokens", 0))),
            a.output_tokens,
        )
        for r, a in zip(recs, arrivals, strict=True)
    ]
    out = {
        "run": run,
        "metrics": stats.run_metrics(recs, worker_ids, ttft_slo_s),
        "oracle": _oracle(jobs, rates),
        "seed_prefill_s": {w: s.get("prefill_s") for w, s in seeds.items()},
        "decisions": decisions_json(decisions, {r.request_id for r in recs}),
        "records": [record_json(r, t0, keep_token_times) for r in recs],
    }
    if served is not None:
        out["served_rates"] = served
        out["oracle_served"] = _oracle(jobs, served)
    return out


def _oracle(jobs: list[Job], rates: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The oracle bound under ``rates`` as JSON; None for runs too long to search (a
    trace: the search grows with requests x workers and would take hours)."""
    if len(jobs) > ORACLE_MAX_JOBS:
        return None
    res = oracle_bound(jobs, to_worker_rates(rates, jobs=len(jobs)))
    return {"makespan_s": res.makespan_s, "requests": res.requests, "exact": res.exact}
