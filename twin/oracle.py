"""The twin's oracle: the best placement of one run's requests under the engine's own schedule.

The bench's bound (bench/oracle.py) is a fluid lower bound: a worker may decode at
its full-batch rate from the first arrival on. No router reaches it on a burst
that ramps up and drains, so "x times the bound" mixes what routing lost with
what the bound ignores. This oracle answers the routing question alone: replay
the run's arrivals through the twin — the engine's real scheduling (FIFO,
max_active, step budget, chunked prefill, prefix cache) on simulated devices
timed by the step model each worker *served* at (the router's priced rates at
each run's end, ``served_rates``) — with every request pinned, and search the
placements:

- exhaustively when there are at most ``EXHAUSTIVE_MAX`` of them (then ``exact``);
- else by single-request moves (first improvement, pass after pass) from the best
  of the starting placements: the ones the bench's policies chose for the same
  arrivals, everything on each worker, and with two workers k requests on one of
  them (spread evenly, or the first k) for every k; within ``budget`` replays.

It also replays the run's own placement, and the run's policy itself. The device
model is one per bench group, so every policy is measured against the same devices:
the median over the group's runs of what each worker served at
(``bench.calibrate.group_served``). A worker's served speed depends on the placement
(the H200's GPU served bursts it shared with the CPU slower than bursts alone), so
by default split placements run on the speeds of the runs that used every worker
and one-worker placements on those of the runs of that worker alone. So, for a
measured makespan M: ``M / own`` is what the twin's device model misses (host
overheads, messaging, noise), and ``own / best`` is what the placement cost under
that model — the part a better router could win back; it splits into ``own /
policy`` (the run's live prices against the policy priced right) and ``policy /
best`` (the policy's objective). All are reported; none is a bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.bench.calibrate import group_served
from tandem.bench.stats import summarize_runs
from tandem.bench.workload import Arrival, PromptBook, Workload
from tandem.twin.replay import TwinWorkerSpec, replay
from tandem.workers.device_model import SimProfile

EXHAUSTIVE_MAX = 4096  # placements (workers ** requests) tried one by one
DEFAULT_BUDGET = 400  # replays for patterns and a hill climb


@dataclass(frozen=True)
class Best:
    makespan_s: float  # the best placement found
    placement: tuple[str, ...]  # worker per request, in arrival-index order
    exact: bool  # every placement was tried
    replays: int

    def to_json(self, own_makespan_s: float) -> dict[str, Any]:
        """This best against a run whose own placement replays in ``own_makespan_s``."""
        counts = {w: self.placement.count(w) for w in sorted(set(self.placement))}
        return {
            "makespan_s": self.makespan_s,
            "requests": counts,
            "own_makespan_s": own_makespan_s,
            "exact": self.exact,
            "replays": self.replays,
        }


def served_devices(
    served: Mapping[str, Mapping[str, Any]], max_active: Mapping[str, int]
) -> list[TwinWorkerSpec]:
    """One twin worker per served worker: its priced prefill rate and decode step
    seconds by batch size (b / aggregate tok/s at b), at its max_active."""
    specs = []
    for wid, r in sorted(served.items()):
        steps = tuple(b / float(x) for b, x in enumerate(r["decode_tok_s"], 1))
        profile = SimProfile(wid, float(r["prefill_tok_s"]), steps)
        specs.append(TwinWorkerSpec(wid, profile, max_active[wid]))
    return specs


class PlacementSearch:
    """Replays of one run's arrivals with every request pinned, memoized."""

    def __init__(
        self,
        specs: Sequence[TwinWorkerSpec],
        arrivals: Sequence[Arrival],
        book: PromptBook,
        seeds_prefix: bool,
        alone: Sequence[TwinWorkerSpec] | None = None,
    ) -> None:
        self.specs, self.arrivals, self.book = list(specs), list(arrivals), book
        self.alone = list(alone) if alone is not None else self.specs  # one-worker placements
        self.seeds_prefix = seeds_prefix
        self.ids = [s.worker_id for s in self.specs]
        self.seen: dict[tuple[str, ...], float] = {}

    def makespan(self, placement: Sequence[str]) -> float:
        """First submit to last token of the run with request i on ``placement[i]``."""
        key = tuple(placement)
        if key not in self.seen:
            pins = {a.index: w for a, w in zip(self.arrivals, key, strict=True)}
            specs = self.alone if len(set(key)) == 1 else self.specs
            rep = replay(specs, "least_loaded", self.arrivals, self.book,
                         seed_prefix=self.seeds_prefix, placement=pins)  # fmt: skip
            self.seen[key] = _makespan(rep)
        return self.seen[key]

    def policy_makespan(self, policy: str) -> float:
        """The run's arrivals under ``policy`` itself, priced by the twin's devices
        from the start (a forced policy on the alone devices, any other on the
        shared ones): what the policy's objective reaches with its prices right."""
        specs = self.alone if policy.startswith("forced:") else self.specs
        rep = replay(specs, policy, self.arrivals, self.book, seed_prefix=self.seeds_prefix)
        return _makespan(rep)

    def best(self, starts: Sequence[Sequence[str]], budget: int = DEFAULT_BUDGET) -> Best:
        """The best placement found (module docstring); ``starts``: placements to
        climb from (the policies' own for these arrivals)."""
        n = len(self.arrivals)
        if len(self.ids) ** n <= EXHAUSTIVE_MAX:
            best = min(itertools.product(self.ids, repeat=n), key=self.makespan)
            return Best(self.makespan(best), best, True, len(self.seen))
        pool = [*map(tuple, starts), *((w,) * n for w in self.ids), *_patterns_for(self.ids, n)]
        best = min(pool, key=self.makespan)
        improved = True
        while improved and len(self.seen) < budget:
            improved = False
            for i, w in itertools.product(range(n), self.ids):
                if w == best[i] or len(self.seen) >= budget:
                    continue
                moved = (*best[:i], w, *best[i + 1 :])
                if self.makespan(moved) < self.makespan(best) - 1e-9:
                    best, improved = moved, True
        return Best(self.makespan(best), best, False, len(self.seen))


def _makespan(rep: Any) -> float:
    t0 = min(r.submit_s for r in rep.records)
    return max(r.token_s[-1] for r in rep.records if r.token_s) - t0


def _patterns_for(ids: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """Two workers: for every count k, k requests on one worker spread evenly over
    the arrivals (either way round) or the first k (the makespan is far from smooth
    in the placement, so single moves alone stop in a poor local minimum)."""
    if len(ids) != 2:
        return []
    out = []
    for k in range(1, n):
        for few, many in (ids, ids[::-1]):
            spread = {round(i * n / k) for i in range(k)}
            out.append(tuple(few if i in spread else many for i in range(n)))
        out.append(tuple(ids[0] if i < k else ids[1] for i in range(n)))
    return out


def run_placement(run: Mapping[str, Any], n: int) -> tuple[str, ...]:
    """A bench run's placement, worker per arrival index ("" for a failed request)."""
    out = [""] * n
    for r in run["records"]:
        out[r["index"]] = r.get("worker") or ""
    return tuple(out)


def annotate(
    doc: dict[str, Any],
    encode: Any,
    budget: int = DEFAULT_BUDGET,
    progress: Any = None,
    served_from: str = "placement",
) -> int:
    """Add ``twin_oracle`` to every run of a bench result whose group carries served
    rates and whose requests all completed; returns how many runs got one. One
    device model per group (``group_served``), so every policy meets the same
    yardstick — ``served_from`` "placement": split placements on the speeds of the
    runs that used every worker, one-worker placements on those of the runs that
    used that worker alone; "all" / "shared": one model for every placement, from
    all runs / the shared ones. One search per arrival schedule (runs with the same
    index share it). "run": each run against the speeds served in that run (its
    ``served_rates``, the router's live step model when it ended): a search per
    run, and a yardstick per run, so the box's drift from run to run leaves the
    model gap (the GPU's median step moved 10.9 -> 14.8 ms between two forced:gpu
    runs of one H200 group); the price: a policy whose placement slows a worker is
    measured against that slower worker. ``encode``: the served model's tokenizer
    (prompts decide prefix-cache hits)."""
    from tandem.bench.spec import parse_worker

    done = 0
    if served_from not in ("placement", "shared", "all", "run"):
        raise ValueError(f"served_from {served_from!r}: placement, shared, all or run")
    for group in doc["groups"]:
        split = {"placement": "shared", "run": "all"}.get(served_from, served_from)
        served = group_served(group, split)
        if not served:
            continue
        group["twin_served"] = served
        group["twin_served_from"] = served_from
        wl = Workload.from_json(group["workload"])
        book = PromptBook(encode, wl)
        active = {
            w["id"]: parse_worker(w["spec"], set()).max_active or group["max_active"]
            for w in doc["config"]["workers"]
        }
        devices = served_devices(served, active)
        alone = None
        if served_from == "placement":
            group["twin_served_alone"] = lone = group_served(group, "alone")
            alone = served_devices(lone, active)
        runs: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for case in group["cases"]:
            for run in case["runs"]:
                runs.setdefault(run["run"], []).append((case["router_policy"], run))
        for index, same in sorted(runs.items()):
            arrivals = wl.arrivals(doc["config"]["seed"] + index)
            owns = [run_placement(r, len(arrivals)) for _, r in same]
            if served_from == "run":  # a search per run, on its own speeds
                searches = [
                    PlacementSearch(
                        served_devices({**served, **run.get("served_rates", {})}, active),
                        arrivals,
                        book,
                        wl.seeds_prefix,
                    )
                    for _, run in same
                ]
                bests = [x.best([o], budget) if "" not in o else None
                         for x, o in zip(searches, owns, strict=True)]  # fmt: skip
            else:
                search = PlacementSearch(devices, arrivals, book, wl.seeds_prefix, alone)
                searches = [search] * len(same)
                found = search.best([o for o in owns if "" not in o], budget)
                bests = [found] * len(same)
            for (policy, run), own, search, best in zip(same, owns, searches, bests, strict=True):
                if "" in own or best is None:  # a failed request: nothing to compare
                    continue
                run["twin_oracle"] = best.to_json(search.makespan(own))
                # A forced policy's placement is its own: its replay is the pinned one.
                forced = policy.startswith("forced:") and len(set(own)) == 1
                mk = search.makespan(own) if forced else search.policy_makespan(policy)
                run["twin_oracle"]["policy_makespan_s"] = mk
                done += 1
                if progress is not None:
                    progress(group["label"], index, run["twin_oracle"])
        for case in group["cases"]:  # the summaries now have the twin's ratios too
            case["summary"] = summarize_runs(case["runs"]) if case["runs"] else {}
    return done
