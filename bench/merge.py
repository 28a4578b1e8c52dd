"""Merge bench results taken in several invocations into one document.

A sweep cut short by a time limit and finished by a second invocation, or a case
measured by another bench of the same workers, belongs in one report. Groups are
matched by label (workload + max active); within a group, cases by their router
policy, whose runs are concatenated and re-summarized. Rates stay per group (each
group records the rates its own invocation measured or was advertised). Every
input's command and config are kept under ``merged_from``.
"""

from __future__ import annotations

import copy
from typing import Any

from tandem.bench import stats


def merge_results(docs: list[dict[str, Any]], policies: tuple[str, ...] = ()) -> dict[str, Any]:
    """One result document from ``docs`` (same worker ids); only ``policies`` if given."""
    if not docs:
        raise ValueError("nothing to merge")
    ids = [sorted(w["id"] for w in d["config"]["workers"]) for d in docs]
    if any(i != ids[0] for i in ids):
        raise ValueError(f"results of different workers cannot be merged: {ids}")
    out = copy.deepcopy(docs[0])
    out["groups"] = []
    out["merged_from"] = [
        {"command": d["command"], "started": d["started"], "config": d["config"]} for d in docs
    ]
    out["complete"] = all(d.get("complete") for d in docs)
    out["wall_s"] = sum(d.get("wall_s") or 0.0 for d in docs) or None
    by_label: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for group in doc["groups"]:
            mine = by_label.get(group["label"])
            if mine is None:
                mine = by_label[group["label"]] = copy.deepcopy(group) | {"cases": []}
                out["groups"].append(mine)
            for case in group["cases"]:
                if policies and case["router_policy"] not in policies:
                    continue
                _add_case(mine, case)
    for group in out["groups"]:
        for case in group["cases"]:
            case["summary"] = stats.summarize_runs(case["runs"])
    out["groups"] = [g for g in out["groups"] if g["cases"]]
    out["groups"].sort(key=lambda g: (g["workload"].get("kind", ""), g["max_active"], g["label"]))
    return out


def _add_case(group: dict[str, Any], case: dict[str, Any]) -> None:
    for have in group["cases"]:
        if have["router_policy"] == case["router_policy"]:
            start = len(have["runs"])
            have["runs"] += [r | {"run": start + i} for i, r in enumerate(case["runs"])]
            have["extra_runs_added"] = have.get("extra_runs_added") or case.get("extra_runs_added")
            return
    group["cases"].append(copy.deepcopy(case))
