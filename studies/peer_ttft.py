"""Where a conc-1 request's first token goes: tandem serve, the peer, the engine alone.

Question (issue 40): tandem's TTFT at conc 1 was 1.15x the peer's (llama_cpp.server,
1 thread) under aiperf on a loaded 2-core box; is that the serving path or the load?
This study times, on the same prompts and interleaved, the first content token of a
streamed chat request of ~500 prompt tokens through `tandem serve` (gateway, router,
worker) and through `python -m llama_cpp.server --n_threads 1 --n_threads_batch 1`,
and the worker's own engine prefilling 500 tokens in process (no router, no HTTP).
Needs `pip install 'llama-cpp-python[server]==0.3.36'` for the peer.

    .venv/bin/python studies/peer_ttft.py --rounds 2 --requests 5
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

import click

from tandem.common.model_files import default_model_path
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf

WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper", "music")
MODEL_NAME = "SmolLM2-135M-Instruct"


def _prompts(n: int, user_tokens: int, seed: int) -> list[str]:
    tok = TextTokenizer(tokenizer_spec_from_gguf(default_model_path()))
    rng, out = random.Random(seed), []
    for _ in range(n):
        text = ""
        while len(tok.encode(text)) < user_tokens:
            text += " ".join(rng.choice(WORDS) for _ in range(20)) + ". "
        out.append(text)
    return out


def _command(server: str, port: int) -> list[str]:
    if server == "tandem":
        return [sys.executable, "-m", "tandem", "serve", "--port", str(port)]
    one_thread = ["--n_threads", "1", "--n_threads_batch", "1"]
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path()),
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
            "--interrupt_requests", "False", *one_thread]  # fmt: skip


def _wait_ready(port: int, timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"nothing answered on port {port} in {timeout_s:.0f} s")


def _ttft_s(port: int, text: str) -> float:
    """Seconds from sending the request to the first chunk carrying text."""
    body = json.dumps({"model": MODEL_NAME, "stream": True, "max_tokens": 2, "temperature": 0,
                       "messages": [{"role": "user", "content": text}]})  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    first = None
    for line in conn.getresponse():
        if first is None and line.startswith(b"data: {"):
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the stream carried no text")
    return first


def serve_ttfts(server: str, prompts: list[str]) -> list[float]:
    """TTFTs of ``prompts`` in turn against a fresh ``server``; the first is a warm-up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(_command(server, port), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        _wait_ready(port)
        return [_ttft_s(port, text) for text in prompts][1:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def engine_prefill_s(prompt_tokens: int, repeats: int) -> float:
    """The worker's engine alone, 1 thread: seconds to prefill ``prompt_tokens``."""
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.profiler import measure_prefill

    backend = LlamaBackend(default_model_path(), n_ctx=4096, threads=1, max_active=1,
                           cache_entries=0)  # fmt: skip
    try:
        return prompt_tokens / measure_prefill(backend, prompt_tokens, repeats, 256,
                                               random.Random(0))  # fmt: skip
    finally:
        backend.close()


@click.command()
@click.option("--rounds", default=2, show_default=True, help="Interleaved rounds.")
@click.option("--requests", default=5, show_default=True, help="Timed requests per server.")
def main(rounds: int, requests: int) -> None:
    got: dict[str, list[float]] = {"peer": [], "tandem": []}
    for r in range(rounds):
        prompts = _prompts(requests + 1, 470, seed=r)  # ~500 tokens with the template
        for server in ("peer", "tandem") if r % 2 == 0 else ("tandem", "peer"):
            got[server] += serve_ttfts(server, prompts)
            click.echo(f"round {r} {server}: median {statistics.median(got[server]):.3f} s")
    engine = engine_prefill_s(500, requests)
    peer, ours = statistics.median(got["peer"]), statistics.median(got["tandem"])
    click.echo(f"TTFT median: peer {peer:.3f} s, tandem {ours:.3f} s "
               f"(tandem/peer {ours / peer:.2f}); engine prefill of 500 tokens alone "
               f"{engine:.3f} s; load {os.getloadavg()}")  # fmt: skip


if __name__ == "__main__":
    main()
