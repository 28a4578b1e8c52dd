"""How long ``tandem serve`` takes to be ready, what it planned, and the GPU memory
each of its processes holds: one start, measured from outside as a user sees it.

    python -m studies.serve_ready --label cold --out serve.json [-- SERVE ARGS]

Starts ``tandem serve`` on free ports with its own run folder, and times the start
until every planned worker is registered at the router (the supervisor's ready
screen) and a first chat completion has been answered. Then reads every process's
GPU memory (``nvidia-smi --query-compute-apps``; null where there is no NVIDIA GPU),
stops serve with SIGTERM and times that too. ``--out`` collects the labels of
several calls in one JSON file: ``<label>_ready_s`` for each, the engines of the
last, ``supervisor_gpu_mib`` (the most any run saw), and every run in ``runs``.
A first call on a fresh machine is the cold start, the next the warm one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tandem.launcher.cluster import free_tcp_port

POLL_S = 0.1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True, help="cold, warm, ...: the run's name")
    ap.add_argument("--out", required=True, help="the JSON file the runs are collected in")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("serve_args", nargs="*", help="more `tandem serve` arguments (after --)")
    args = ap.parse_args(argv)
    run = measure(args.label, args.serve_args, args.timeout_s)
    merge(Path(args.out), run)
    print(json.dumps({k: v for k, v in run.items() if k != "plan"}, indent=1))
    return 0 if run.get("ready_s") is not None else 1


def measure(label: str, serve_args: list[str], timeout_s: float) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"serve-{label}-"))
    port, client, worker = free_tcp_port(), free_tcp_port(), free_tcp_port()
    cmd = [sys.executable, "-m", "tandem", "serve", "--port", str(port), "--run-dir",
           str(run_dir), "--set", f"router.client_addr=tcp://127.0.0.1:{client}",
           "--set", f"router.worker_addr=tcp://127.0.0.1:{worker}", *serve_args]  # fmt: skip
    log = open(run_dir / "serve.out", "wb")  # noqa: SIM115 - closed below
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run: dict[str, Any] = {"label": label, "cmd": cmd[2:], "run_dir": str(run_dir)}
    try:
        ready = _until_ready(proc, run_dir, f"tcp://127.0.0.1:{client}", t0 + timeout_s)
        if ready is not None:
            run["ready_s"] = round(ready[0] - t0, 2)
            run["workers"] = ready[1]
            run["first_answer_s"] = _first_answer(f"http://127.0.0.1:{port}")
            run["gpu_mib"] = gpu_memory(proc.pid)
    finally:
        run["stop_s"] = _stop(proc)
        log.close()
    run["plan"] = (run_dir / "plan.txt").read_text() if (run_dir / "plan.txt").exists() else ""
    engines = run_dir / "engines.json"
    run["engines"] = json.loads(engines.read_text()) if engines.exists() else {}
    run["serve_tail"] = (run_dir / "serve.out").read_text(errors="replace")[-2000:]
    return run


def _planned_workers(run_dir: Path) -> list[str]:
    plan = run_dir / "plan.txt"
    if not plan.exists():
        return []
    return [line.split()[0] for line in plan.read_text().splitlines() if " tandem worker " in line]


def _until_ready(
    proc: subprocess.Popen[bytes], run_dir: Path, client_addr: str, deadline: float
) -> tuple[float, list[dict[str, Any]]] | None:
    """(monotonic time every planned worker was registered, their status rows)."""
    from tandem.client.errors import TandemError
    from tandem.client.sync import Client

    c = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            planned = _planned_workers(run_dir)
            if planned:
                try:
                    c = c or Client(client_addr, timeout_s=1.0, connect_timeout_s=0.5, retries=0)
                    rows = {str(w["id"]): w for w in c.status().workers}
                except TandemError:  # not up yet: a fresh socket next time
                    if c is not None:
                        c.close()
                    c, rows = None, {}
                if all(w in rows for w in planned):
                    keep = ("id", "backend", "device", "prefill_tok_s", "decode_tok_s",
                            "provisional")  # fmt: skip
                    return time.monotonic(), [{k: rows[w].get(k) for k in keep} for w in planned]
            time.sleep(POLL_S)
    finally:
        if c is not None:
            c.close()
    return None


def _first_answer(url: str) -> float | None:
    body = json.dumps({"messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 8}).encode()  # fmt: skip
    req = urllib.request.Request(f"{url}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})  # fmt: skip
    t = time.monotonic()
    try:
        urllib.request.urlopen(req, timeout=60).read()
    except OSError:
        return None
    return round(time.monotonic() - t, 3)


def gpu_memory(root_pid: int) -> dict[str, int] | None:
    """MiB of GPU memory per process of serve's tree, by role: supervisor, router,
    gateway, or the worker's id; None without nvidia-smi."""
    import psutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    out = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    used = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            used[int(pid)] = int(mib)
    names = {root_pid: "supervisor"}
    for child in psutil.Process(root_pid).children(recursive=True):
        argv = child.cmdline()
        role = next((a for a in argv if a in ("router", "gateway", "worker")), child.name())
        names[child.pid] = argv[argv.index("--worker-id") + 1] if "--worker-id" in argv else role
    got = {name: used.get(pid, 0) for pid, name in names.items()}
    got["other"] = sum(m for pid, m in used.items() if pid not in names)  # another container's
    return got


def _stop(proc: subprocess.Popen[bytes]) -> float:
    t = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return round(time.monotonic() - t, 2)


def merge(path: Path, run: dict[str, Any]) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {"runs": []}
    doc[f"{run['label']}_ready_s"] = run.get("ready_s")
    if run.get("engines"):
        doc["engines"] = {dev: c["engine"] for dev, c in run["engines"].items()}
    mib = (run.get("gpu_mib") or {}).get("supervisor")
    if mib is not None:
        doc["supervisor_gpu_mib"] = max(mib, doc.get("supervisor_gpu_mib") or 0)
    doc["runs"].append(run)
    path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
