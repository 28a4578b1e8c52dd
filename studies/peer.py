"""tandem against llama-cpp-python's own OpenAI server on the same machine and GGUF.

Starts ``python -m llama_cpp.server`` (the peer) and ``tandem serve`` in turn, one at
a time, on free loopback ports, and drives each with the same streaming chat
workloads: 500 prompt tokens as the server counts them (the chat template's own
tokens included), exactly 128 output tokens (``min_tokens`` = ``max_tokens``
on both), at concurrency 1, concurrency 4, a burst of 12, and concurrency 4 over a
400-token shared prefix. Repetitions interleave the servers (peer, tandem configs,
peer, ...) with fresh prompts each repetition (no server finds the last
repetition's prompts in its cache), and the result is ratios tandem / peer per
repetition, with their median and spread.

The client is NVIDIA's aiperf (``--client aiperf``, studies/peer_aiperf.py: a client
neither server's authors wrote) or a small asyncio HTTP/1.1 SSE reader of our own
(``--client ours``, no SDK), one connection per request, timing each content chunk
as it arrives; both servers send one chunk per token. ITL is per request, (E2E -
TTFT) / (tokens - 1), as aiperf defines it; "gap" is every pause between two chunks
of one stream, pooled.

    .venv/bin/pip install 'llama-cpp-python[server]==0.3.36'   # the peer's own deps
    .venv/bin/python studies/peer.py --reps 3 --client aiperf --out peer.json
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import click

from tandem.common.model_files import default_model_path
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.workers.backends.llama_weights import served_weights

sys.path.insert(0, str(Path(__file__).parent))
import peer_aiperf  # noqa: E402 - studies/ is not a package on the path

PROMPT_TOKENS, OUTPUT_TOKENS, SHARED_TOKENS = 500, 128, 400
WORKLOADS = {  # name: (requests, concurrency, shared prefix)
    "conc 1": (3, 1, False),
    "conc 4": (8, 4, False),
    "burst 12": (12, 12, False),
    "shared prefix, conc 4": (8, 4, True),
}
START_TIMEOUT_S = 180.0
WORDS = ["river", "stone", "lantern", "market", "orchard", "signal", "harbor", "copper",
         "meadow", "quiet", "engine", "winter", "ladder", "garden", "silver", "thread"]  # fmt: skip


@dataclass
class Stream:
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    chunks: list[float] = field(default_factory=list)  # arrival times from the send
    tokens: int = 0  # usage.completion_tokens, else content chunks
    cached: int = 0  # usage.prompt_tokens_details.cached_tokens (tandem reports it)
    prompt: int = 0  # usage.prompt_tokens: what the server received

    @property
    def itl_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / max(1, self.tokens - 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- the servers
def start_peer(port: int, threads: int | None, flags: list[str]) -> subprocess.Popen:
    """``--weights q8_0`` (not the server's option): serve the file a tandem CPU worker
    converts the model to (workers/backends/llama_weights.py), the same bytes."""
    model = default_model_path()
    if "--weights" in flags:
        i = flags.index("--weights")
        model, _ = served_weights(model, flags[i + 1], 1)
        flags = flags[:i] + flags[i + 2 :]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
           # its default (True) aborts a running stream when another request arrives
           "--interrupt_requests", "False"]  # fmt: skip
    if threads:
        cmd += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    return spawn([*cmd, *flags])


def start_tandem(port: int, threads: int | None, flags: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tandem", "serve", "--port", str(port),
           "--set", f"router.client_addr=tcp://127.0.0.1:{free_port()}",
           "--set", f"router.worker_addr=tcp://127.0.0.1:{free_port()}",
           "--set", "router.metrics_port=0"]  # fmt: skip
    if threads:
        cmd += ["--threads", str(threads)]
    return spawn([*cmd, *flags])


def spawn(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


async def wait_ready(port: int, proc: subprocess.Popen) -> None:
    """Until a one-token chat answers (the model loaded, a worker registered)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            await chat(port, "hi", 1)
            return
        except (OSError, RuntimeError, asyncio.IncompleteReadError):
            await asyncio.sleep(1.0)
    raise RuntimeError(f"server on port {port} not ready in {START_TIMEOUT_S:.0f} s")


# ---------------------------------------------------------------- the client
async def chat(port: int, text: str, max_tokens: int) -> Stream:
    body = json.dumps({
        "messages": [{"role": "user", "content": text}], "stream": True,
        "max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 0,
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + body)
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"answered {status!r}")
        while (await reader.readline()) != b"\r\n":
            pass  # headers: the body is chunked
        s, buf = Stream(), b""
        while size := int((await reader.readline()).split(b";")[0], 16):
            buf += await reader.readexactly(size + 2)
            *events, buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
            for e in events:
                _event(s, e, time.perf_counter() - t0)
        return _finish(s, time.perf_counter() - t0)
    finally:
        writer.close()


def _event(s: Stream, raw: bytes, at_s: float) -> None:
    line = raw.strip()
    if not line.startswith(b"data: {"):
        return
    event = json.loads(line[6:])
    usage = event.get("usage")
    if usage:
        s.tokens = usage.get("completion_tokens", 0)
        s.cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        s.prompt = usage.get("prompt_tokens", 0)
    for c in event.get("choices") or []:
        if (c.get("delta") or {}).get("content"):
            s.chunks.append(at_s)


def _finish(s: Stream, e2e_s: float) -> Stream:
    s.e2e_s = e2e_s
    s.ttft_s = s.chunks[0] if s.chunks else e2e_s
    s.tokens = s.tokens or len(s.chunks)
    return s


# ---------------------------------------------------------------- workloads
def make_prompts(tok: TextTokenizer, rep: int, n: int, shared: bool) -> list[str]:
    """``n`` user messages of PROMPT_TOKENS tokens once templated, new each repetition;
    with ``shared`` their first SHARED_TOKENS tokens are one text."""
    rng = random.Random(f"{rep}-{n}-{shared}")
    words = WORDS
    template = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": ""}])))

    def text(tokens: int, head: str) -> str:
        ids = tok.encode(head + " ".join(rng.choice(words) for _ in range(tokens * 2)))
        return tok.decode(ids[:tokens])

    common = text(SHARED_TOKENS, f"Shared notes {rep}: ") if shared else ""
    rest = PROMPT_TOKENS - template - (SHARED_TOKENS if shared else 0)
    return [common + text(rest, f" Request {rep}.{i}: ") for i in range(n)]


async def run_workload(port: int, prompts: list[str], conc: int) -> tuple[float, list[Stream]]:
    """(wall seconds, streams): ``conc`` streams at a time, closed loop."""
    todo = list(prompts)
    out: list[Stream] = []

    async def slot() -> None:
        while todo:
            out.append(await chat(port, todo.pop(0), OUTPUT_TOKENS))

    t0 = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(conc)))
    return time.perf_counter() - t0, out


def summary(wall_s: float, streams: list[Stream]) -> dict[str, float]:
    gaps = [b - a for s in streams for a, b in zip(s.chunks, s.chunks[1:], strict=False)]
    itl = sorted(s.itl_s for s in streams)
    return {
        "out_tok_s": sum(s.tokens for s in streams) / wall_s,
        "ttft_p50": statistics.median(s.ttft_s for s in streams),
        "itl_p50": statistics.median(itl),
        "itl_p99": pct(itl, 0.99),
        "gap_p99": pct(sorted(gaps), 0.99),
        "gap_max": max(gaps, default=0.0),
        "e2e_p50": statistics.median(s.e2e_s for s in streams),
        "tokens_min": min(s.tokens for s in streams),
        "cached_mean": statistics.fmean(s.cached for s in streams),
        "prompt_tokens_min": min(s.prompt for s in streams),
        "prompt_tokens_max": max(s.prompt for s in streams),
    }


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


# ---------------------------------------------------------------- the study
SERVERS = {"peer": start_peer, "tandem": start_tandem}


async def one_server(cfg: str, rep: int, tok: TextTokenizer, aiperf: Path | None) -> dict:
    """Start the server ``cfg`` names, run every workload, stop it. ``aiperf``: drive it
    with aiperf (its tokenizer folder), else with our client."""
    name, _, rest = cfg.partition(":")
    threads, _, extra = rest.partition(":")
    pairs = [kv.partition("=") for kv in extra.split(",") if kv]
    flags = [x for k, _, v in pairs for x in (f"--{k}", v)]
    port = free_port()
    proc = SERVERS[name](port, int(threads or 0) or None, flags)
    try:
        await wait_ready(port, proc)
        # What the server counts in a prompt built like the workloads' (another text: the
        # peer reuses its last prompt's KV); the peer's stream carries no usage.
        results = {"prompt check": {"prompt_tokens": prompt_tokens(port, tok, rep)}}
        for wl, (n, conc, shared) in WORKLOADS.items():
            prompts = make_prompts(tok, rep, n, shared)
            if aiperf is None:
                results[wl] = summary(*await run_workload(port, prompts, conc))
                continue
            out = aiperf.parent / "".join(
                c for c in f"rep{rep}-{cfg}-{wl}" if c.isalnum() or c in "-="
            )
            results[wl] = await asyncio.to_thread(
                peer_aiperf.profile, port, prompts, conc, OUTPUT_TOKENS, aiperf, out
            )
        return results
    finally:
        stop(proc)


def prompt_tokens(port: int, tok: TextTokenizer, rep: int) -> int:
    text = make_prompts(tok, rep + 1000, 1, False)[0]
    body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 1})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 body.encode(), {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=START_TIMEOUT_S) as r:
        return int(json.load(r)["usage"]["prompt_tokens"])


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


@click.command()
@click.option("--reps", default=3, show_default=True)
@click.option("--config", "configs", multiple=True, default=("peer:0", "tandem:0", "tandem:2"),
              show_default=True, help="SERVER:THREADS[:FLAG=VALUE,...] (0: its default "
              "threads; FLAGs: its other options, e.g. tandem:0:max-active=2).")  # fmt: skip
@click.option("--client", type=click.Choice(["aiperf", "ours"]), default="aiperf",
              show_default=True, help="aiperf (studies/peer_aiperf.py) or ours.")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path), default=Path("peer.json"))
def main(reps: int, configs: tuple[str, ...], client: str, out: Path) -> None:
    """Run the comparison; write every repetition's summaries as JSON to OUT (aiperf's
    artifacts in OUT's name + ``.aiperf/``)."""
    spec = tokenizer_spec_from_gguf(default_model_path())
    tok = TextTokenizer(spec)
    aiperf = None
    if client == "aiperf":
        aiperf = peer_aiperf.tokenizer_folder(spec, out.with_suffix(".aiperf") / "tokenizer")
    record: dict = {"client": client, "loads": [], "runs": []}
    for rep in range(reps):
        order = list(configs) if rep % 2 == 0 else list(reversed(configs))
        for cfg in order:
            record["loads"].append(f"rep {rep} {cfg} start: {load()}")
            res = asyncio.run(one_server(cfg, rep, tok, aiperf))
            record["runs"].append({"rep": rep, "config": cfg, "results": res})
            rates = {k: round(v["out_tok_s"], 2) for k, v in res.items() if "out_tok_s" in v}
            click.echo(f"rep {rep} {cfg}: {json.dumps(rates)}")
            out.write_text(json.dumps(record, indent=1))
    record["loads"].append(f"end: {load()}")
    out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
