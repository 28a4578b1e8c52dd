"""Gateway overhead: the same requests through HTTP (the OpenAI gateway) and through
the Python client, against the same cluster, interleaved so drift hits both alike.

- TTFT at concurrency 1: each prompt is first run once (unmeasured) so both paths
  find the same warm prefix cache; then it is measured through both, alternating
  which goes first. Added TTFT = median(HTTP) - median(client).
- Tokens/s at concurrency C: rounds of C parallel streams, alternating the path per
  round; aggregate = output tokens / round wall time.

The HTTP side is a minimal asyncio SSE reader (no SDK) on kept-alive connections,
as SDKs pool theirs, so what is measured is the gateway, not a client library's
parsing or TCP connection set-up.

    python studies/gateway_overhead.py --backend sim --out docs/results/gateway-overhead.md
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import click
import psutil

from tandem.cli.options import out_file_option
from tandem.client import AsyncClient
from tandem.launcher.cluster import Cluster, WorkerSpec


@dataclass
class Run:
    ttft_s: float
    total_s: float
    tokens: int


def prompt(i: int) -> str:
    return f"Story {i}: a traveller reaches the {i}th town on the river and"


async def via_client(c: AsyncClient, text: str, max_tokens: int) -> Run:
    t0 = time.perf_counter()
    first, n = 0.0, 0
    async for d in c.stream(text, max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
        if d.token_ids and not first:
            first = time.perf_counter()
        n += len(d.token_ids)
    return Run(first - t0, time.perf_counter() - t0, n)


class Http:
    """One kept-alive HTTP/1.1 connection to the gateway (as SDKs pool theirs)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def stream(self, text: str, max_tokens: int) -> Run:
        """POST /v1/completions with stream=true; decodes the chunked SSE body by hand."""
        body = json.dumps(
            {
                "prompt": text,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        t0 = time.perf_counter()
        if self.conn is None:
            self.conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.conn
        writer.write(head.encode() + body)
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"gateway answered {status!r}")
        while (await reader.readline()) != b"\r\n":
            pass  # headers (the body is chunked)
        first, tokens = 0.0, 0
        while size := int(await reader.readline(), 16):
            chunk = await reader.readexactly(size + 2)  # + CRLF
            for line in chunk.split(b"\n"):
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif not first and event["choices"][0]["text"]:
                    first = time.perf_counter()
        await reader.readexactly(2)  # the CRLF after the last chunk
        return Run(first - t0, time.perf_counter() - t0, tokens)

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()


async def measure(
    client_addr: str,
    port: int,
    gateway: psutil.Process,
    n: int,
    conc: int,
    rounds: int,
    max_tok: int,
) -> tuple[dict[str, list[Run]], dict[str, list[float]], dict[str, float]]:
    cpu = {"seq": 0.0, "agg": 0.0}  # the gateway process's CPU seconds in each phase
    pool = [Http(port) for _ in range(conc)]  # one kept-alive connection per stream slot
    async with AsyncClient(client_addr) as c:
        paths = {
            "client": lambda t, m, k=0: via_client(c, t, m),
            "http": lambda t, m, k=0: pool[k].stream(t, m),
        }
        seq: dict[str, list[Run]] = {"client": [], "http": []}
        cpu0 = _cpu_s(gateway)
        for i in range(n):
            await via_client(c, prompt(i), 1)  # warm the prefix cache for both paths
            order = ("client", "http") if i % 2 == 0 else ("http", "client")
            for name in order:
                seq[name].append(await paths[name](prompt(i), max_tok))
        cpu["seq"] = _cpu_s(gateway) - cpu0
        agg: dict[str, list[float]] = {"client": [], "http": []}
        cpu0 = _cpu_s(gateway)
        for r in range(2 * rounds):
            name = ("client", "http")[r % 2]
            t0 = time.perf_counter()
            runs = await asyncio.gather(
                *(paths[name](prompt(1000 + r * conc + k), max_tok, k) for k in range(conc))
            )
            agg[name].append(sum(x.tokens for x in runs) / (time.perf_counter() - t0))
        cpu["agg"] = _cpu_s(gateway) - cpu0
    for h in pool:
        h.close()
    return seq, agg, cpu


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def report(seq: dict, agg: dict, cpu: dict, args: dict, load: tuple[float, float]) -> str:
    def p90_ms(xs: list[float]) -> float:
        return 1e3 * statistics.quantiles(xs, n=10)[8]

    rows = []
    for name in ("client", "http"):
        ttft = [r.ttft_s for r in seq[name]]
        decode = [(r.tokens - 1) / (r.total_s - r.ttft_s) for r in seq[name] if r.tokens > 1]
        rows.append(
            f"| {name} | {1e3 * statistics.median(ttft):.2f} | {p90_ms(ttft):.2f} | "
            f"{statistics.median(decode):.1f} | {statistics.median(agg[name]):.1f} |"
        )
    added = 1e3 * (
        statistics.median(r.ttft_s for r in seq["http"])
        - statistics.median(r.ttft_s for r in seq["client"])
    )
    ratio = statistics.median(agg["http"]) / statistics.median(agg["client"])
    # Every request runs to its budget (ignore_eos), so the HTTP rounds carried this many.
    http_tokens = args["rounds"] * args["concurrency"] * args["max_tokens"]
    n_http = len(seq["http"])
    single = statistics.median(
        (r.tokens - 1) / (r.total_s - r.ttft_s) for r in seq["http"]
    ) / statistics.median((r.tokens - 1) / (r.total_s - r.ttft_s) for r in seq["client"])
    return "\n".join(
        [
            f"Run: `{args}` on {platform.node()} ({os.cpu_count()} cores, "
            f"load average {load[0]:.2f} before, {load[1]:.2f} after).",
            "",
            "| path | TTFT median ms | TTFT p90 ms | decode tok/s per request (median) | "
            f"aggregate tok/s at {args['concurrency']} streams (median) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Added TTFT (median HTTP - median client): **{added:.2f} ms**; "
            f"tokens/s HTTP/client: **{ratio:.3f}x** at {args['concurrency']} streams, "
            f"**{single:.3f}x** for one stream.",
            "",
            f"Gateway CPU (user + system, whole process): {1e3 * cpu['seq'] / n_http:.2f} ms per "
            f"{args['max_tokens']}-token streamed request at concurrency 1; "
            f"{1e6 * cpu['agg'] / http_tokens:.0f} us per token at "
            f"{args['concurrency']} streams.",
        ]
    )


@click.command()
@click.option(
    "--backend", type=click.Choice(["sim", "llama.cpp"]), default="sim", show_default=True
)
@click.option("--profile", default="gpu-m2", show_default=True, help="sim device profile.")
@click.option("--threads", type=int, default=1, show_default=True, help="llama.cpp threads.")
@click.option("--requests", "n", type=int, default=30, show_default=True)
@click.option("--concurrency", type=int, default=8, show_default=True)
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--max-tokens", type=int, default=64, show_default=True)
@out_file_option(help="Append the report.")
def main(
    backend: str, profile: str, threads: int, n: int, concurrency: int, rounds: int,
    max_tokens: int, out: str | None,
) -> None:  # fmt: skip
    """Measure what the HTTP gateway adds over the Python client."""
    worker = ["--backend", backend, "--max-active", str(concurrency), "--n-ctx", "8192"]
    worker += ["--profile", profile] if backend == "sim" else ["--threads", str(threads)]
    args = dict(backend=backend, requests=n, concurrency=concurrency, rounds=rounds)
    args |= {"max_tokens": max_tokens, **({"profile": profile} if backend == "sim" else {})}
    load0 = os.getloadavg()[0]
    with Cluster(workers=[WorkerSpec("w0", worker)], transport="tcp") as c:
        url = c.start_gateway()
        port = int(url.rsplit(":", 1)[1])
        gateway = psutil.Process(c.procs["gateway"].pid)
        seq, agg, cpu = asyncio.run(
            measure(c.client_addr, port, gateway, n, concurrency, rounds, max_tokens)
        )
    text = report(seq, agg, cpu, args, (load0, os.getloadavg()[0]))
    click.echo(text)
    if out:
        with open(Path(out), "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
