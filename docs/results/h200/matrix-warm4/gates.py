"""lookahead's hunger gate and four looser ones, replayed in the twin on recorded H200 runs.

Each bench result's groups are replayed through the twin (twin/replay.py) on the
step times its workers served (the group's runs that used every worker:
``group_served(group, "shared")``), for the first ``RUNS`` arrival schedules of
each group, once per gate; printed: mean makespan against the current gate and
mean E2E. A gate is swapped in by replacing ``lookahead.batch_hungry`` (and, for
the "no rollout while a queue stands" variants, ``Lookahead.choose``) in this
process: an experiment, not a policy of the router.

    cd docs/results/h200
    python matrix-warm4/gates.py matrix-warm*/*/result.json
    python matrix-warm4/gates.py --runs 8 matrix-warm*/poisson/result.json
    python matrix-warm4/gates.py --robustness   # the suite's 8-burst at GPU max active 4
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import tandem.broker.policies.lookahead as la
from tandem.bench.calibrate import group_served
from tandem.bench.run import make_encoder
from tandem.bench.spec import parse_worker
from tandem.bench.workload import PromptBook, Workload
from tandem.broker.policies.finish import step_model
from tandem.broker.policies.views import WorkerView
from tandem.twin.oracle import _makespan, served_devices
from tandem.twin.replay import replay

RUNS = 2
STRICT, CHOOSE = la.batch_hungry, la.Lookahead.choose
Gate = Callable[[WorkerView], bool]


def _room(w: WorkerView) -> tuple[tuple[float, ...], int, int] | None:
    steps = step_model(w).decode_s
    top, joins = min(w.max_active, len(steps) - 1), w.n_requests + 1
    return (steps, top, joins) if joins < top else None


def none(w: WorkerView) -> bool:
    """Room to grow is enough."""
    return _room(w) is not None


def ratio(r: float) -> Gate:
    """The step at max_active at most ``r`` times the step the request joins."""

    def gate(w: WorkerView) -> bool:
        room = _room(w)
        return room is not None and room[0][room[1]] <= room[0][room[2]] * r

    return gate


def scaling(beta: float) -> Gate:
    """Decode throughput from the joined batch to max_active growing at least as
    (max_active / joined) ** beta (the strict gate is beta = 1)."""

    def gate(w: WorkerView) -> bool:
        room = _room(w)
        if room is None:
            return False
        steps, top, joins = room
        growth = top / joins
        return growth * steps[joins] / steps[top] >= growth**beta * (1 - 1e-9)

    return gate


def _no_queue(self: la.Lookahead, req: la.RouteRequest, workers: list[WorkerView]) -> la.Decision:
    if any(w.queued for w in workers):
        return self.base.choose(req, workers)
    return CHOOSE(self, req, workers)


GATES: dict[str, tuple[Gate, bool]] = {  # name: (gate, no rollout while a queue stands)
    "strict": (STRICT, False),
    "none": (none, False),
    "step<=1.5x": (ratio(1.5), False),
    "sqrt": (scaling(0.5), False),
    "sqrt+noqueue": (scaling(0.5), True),
}


def use(name: str) -> None:
    gate, no_queue = GATES[name]
    la.batch_hungry = gate
    la.Lookahead.choose = _no_queue if no_queue else CHOOSE  # type: ignore[method-assign]


def main(paths: list[str]) -> None:
    for path in paths:
        doc = json.loads(Path(path).read_text())
        workers = doc["config"]["workers"]
        encode = make_encoder(parse_worker(w["spec"], set()) for w in workers)
        for group in doc["groups"]:
            served = group_served(group, "shared")
            if not served:
                continue
            wl = Workload.from_json(group["workload"])
            book = PromptBook(encode, wl)
            active = {
                w["id"]: parse_worker(w["spec"], set()).max_active or group["max_active"]
                for w in workers
            }
            devices = served_devices(served, active)
            got: dict[str, list[tuple[float, float]]] = {name: [] for name in GATES}
            for index in range(RUNS):
                arrivals = wl.arrivals(doc["config"]["seed"] + index)
                for name in GATES:
                    use(name)
                    rep = replay(devices, "lookahead", arrivals, book, seed_prefix=wl.seeds_prefix)
                    ended = [r for r in rep.records if r.token_s]
                    e2e = statistics.mean(r.token_s[-1] - r.submit_s for r in ended)
                    got[name].append((_makespan(rep), e2e))
            use("strict")
            base = statistics.mean(m for m, _ in got["strict"])
            cells = [
                f"{name} {statistics.mean(m for m, _ in v):.2f} s "
                f"({statistics.mean(m for m, _ in v) / base - 1:+.1%}, "
                f"E2E {statistics.mean(e for _, e in v):.2f})"
                for name, v in got.items()
            ]
            print(f"{path}: {group['label']} | " + " | ".join(cells), flush=True)


def robustness_case() -> None:
    """The robustness suite's 8-burst at GPU max active 4 (sim H200 profiles, workers
    measuring themselves at start) under each gate, correct and noisy prices:
    makespan (what the suite judges) and mean E2E (what the rollout minimizes)."""
    from tandem.twin.robustness import SCENARIOS, Case

    encode = make_encoder([parse_worker("sim:h200-gpu", set())])
    case = Case(gpu_active=4, requests=8)
    wl = case.workload()
    for scenario in SCENARIOS[:2]:
        fleet = scenario.fleet(case.fleet())
        for name, policy in [(g, "lookahead") for g in GATES] + [("-", "least_loaded")]:
            use(name if name in GATES else "strict")
            rep = replay(fleet, policy, wl.arrivals(0), PromptBook(encode, wl))
            t0 = min(r.submit_s for r in rep.records)
            end = max(r.token_s[-1] for r in rep.records)
            e2e = statistics.mean(r.token_s[-1] - r.submit_s for r in rep.records)
            on_cpu = sum(r.worker == "cpu" for r in rep.records)
            print(f"{scenario.name}: {policy} gate {name}: makespan {end - t0:.3f} s, "
                  f"E2E {e2e:.3f} s, {on_cpu} on the CPU")  # fmt: skip
    use("strict")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--robustness"]:
        robustness_case()
        sys.exit()
    if args[:1] == ["--runs"]:
        RUNS, args = int(args[1]), args[2:]
    main(args)
