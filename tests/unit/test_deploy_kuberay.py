"""deploy/kuberay.yaml: a RayCluster KubeRay accepts, whose head runs a `tandem serve
--ray` command our CLI parses, every pod on one image with Ray's pinned series."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from tandem.cli.serve import serve
from tandem.fleet import RAY_SERIES

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kuberay.yaml"


def _cluster() -> dict[str, Any]:
    (doc,) = list(yaml.safe_load_all(MANIFEST.read_text()))
    return doc


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [doc["spec"]["headGroupSpec"], *doc["spec"]["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_it_is_a_raycluster_on_the_pinned_ray() -> None:
    doc = _cluster()
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    assert doc["spec"]["rayVersion"].startswith(RAY_SERIES)
    assert doc["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert len({c["image"] for c in _containers(doc)}) == 1  # every node starts workers


def test_every_container_starts_ray_and_the_head_tandem() -> None:
    doc = _cluster()
    head, *workers = _containers(doc)
    for c in workers:  # the annotation: each says its command, ray start included
        assert "$KUBERAY_GEN_RAY_START_CMD" in " ".join(c["args"])
    script = " ".join(head["args"])
    assert "$KUBERAY_GEN_RAY_START_CMD &" in script
    tandem = shlex.split(script.rpartition("exec ")[2])
    assert tandem[:2] == ["tandem", "serve"]
    ctx = serve.make_context("serve", tandem[2:])  # the CLI takes it as written
    assert ctx.params["ray_address"] == "auto" and ctx.params["host"] == "0.0.0.0"
    ports = {p["containerPort"] for p in head["ports"]}
    assert ctx.params["port"] in ports and 6379 in ports


def test_gpu_pods_ask_kubernetes_for_their_gpus() -> None:
    (gpu,) = [g for g in _cluster()["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu"]
    (c,) = gpu["template"]["spec"]["containers"]
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == "1"
