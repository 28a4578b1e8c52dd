"""Helpers shared by every test layer: markers, worker arguments, fakes, references.

- ``needs_llama`` / ``LLAMA_ARGS``: real llama.cpp workers on a 2-core machine.
- ``tiny_tokenizer`` / ``Harness``: the live router's loop (broker/router.py) on
  inproc:// sockets, pumped by hand through its public steps, with fake workers and a
  fake client (no serving thread, no timing, no model); ``h.core`` is its RouterCore.
- ``FakeBackend``: a fake model backend for engine tests: deterministic tokens,
  counted work. Not a simulated device (that is ``workers/backends/sim.py``): it
  has no timing at all, it only records what the engine asked it to compute.
- ``greedy_reference``: a raw llama.cpp greedy loop for parity tests.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models

from tandem.broker.policies import WorkerView
from tandem.broker.router import Router, RouterConfig
from tandem.common import protocol as p
from tandem.common.settings import Addresses
from tandem.common.tokenizer import TokenizerSpec
from tandem.common.transport import DealerSocket
from tandem.workers.engine import KVFull
from tandem.workers.prefix_cache import Match
from tandem.workers.request import Request

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python is not installed")

# Small contexts keep worker start-up and memory low on a 2-core machine; no start-up
# measurement (its seconds, per worker started; tests/process/test_measured_start.py
# covers it).
LLAMA_ARGS = ["--threads", "1", "--n-ctx", "4096", "--max-active", "4", "--heartbeat-s", "0.2",
              "--warmup", "off"]  # fmt: skip

EOS = 0  # FakeBackend's end-of-generation token


def tiny_tokenizer() -> dict[str, Any]:
    vocab = {f"t{i}": i for i in range(1000)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    return TokenizerSpec(tok.to_str(), None, (0,), None, False).to_wire()


def fake_ready(
    wid: str,
    rates: tuple[float, list[float]],
    max_active: int,
    spec: dict[str, Any],
    capabilities: list[str] | None = None,
) -> p.Ready:
    """The Ready of a fake worker: a sim device, prefill and decode ``rates``, 8192
    tokens of context, blocks of 16, a heartbeat every 0.5 s, tokenizer ``spec``."""
    return p.Ready(wid, "sim", f"sim-{wid}", "m.gguf", max_active, 8192, 16, rates[0],
                   rates[1], 0.5, spec, capabilities=capabilities or [])  # fmt: skip


class Harness:
    """A Router on inproc sockets plus fake workers and one fake client."""

    def __init__(self, tmp_path: Path, policy: str = "phase_cost", **cfg: Any) -> None:
        tag = uuid.uuid4().hex
        self.log_path = tmp_path / "decisions.jsonl"
        addrs = Addresses(f"inproc://c-{tag}", f"inproc://w-{tag}")
        cfg.setdefault("accept_hold_ms", 0.0)  # pumped by hand: no clock to wait on
        cfg.setdefault("decision_log", str(self.log_path))  # None: a router that logs none
        self.router = Router(RouterConfig(policy=policy, **cfg), addrs)
        self.core = self.router.core
        self.client = DealerSocket(addrs.client)
        self.workers: dict[str, DealerSocket] = {}
        self.spec = tiny_tokenizer()

    def pump(self) -> None:
        r = self.router
        for _ in range(3):  # messages can trigger replies that trigger messages
            r.drain_workers()
            r.drain_clients()
            r.dispatch_pending()

    def add_worker(
        self,
        wid: str,
        rates: tuple[float, list[float]],
        max_active: int = 4,
        capabilities: list[str] | None = None,
    ) -> None:
        sock = DealerSocket(self.router.worker_sock.address, identity=wid.encode())
        sock.send(fake_ready(wid, rates, max_active, self.spec, capabilities))
        self.pump()
        assert isinstance(self.recv(sock), p.Welcome)
        self.workers[wid] = sock

    def recv(self, sock: DealerSocket) -> p.Message:
        assert sock.poll(1000), "expected a message"
        msg = sock.recv()
        assert not isinstance(msg, p.ProtocolError)
        return msg

    def submit(self, rid: str, tokens: list[int], max_tokens: int = 32) -> p.Accepted:
        self.client.send(p.Submit(rid, tokens=tokens, sampling=p.SamplingParams(max_tokens)))
        self.pump()
        msg = self.recv(self.client)
        assert isinstance(msg, p.Accepted), msg
        return msg

    def assigned(self, wid: str) -> p.Assign:
        msg = self.recv(self.workers[wid])
        assert isinstance(msg, p.Assign)
        return msg

    def heartbeat(self, wid: str, seq: int, active=(), queued=(), blocks=None, steps=None) -> None:
        cache = p.CacheReport(full=True, seq=seq, blocks=list(blocks or []))
        hb = p.Heartbeat(wid, seq, list(active), list(queued), 0, 8192, cache, steps)
        self.workers[wid].send(hb)
        self.pump()

    def view(self, wid: str, tokens: list[int], live: bool = True) -> WorkerView:
        return self.core.workers[wid].view(tokens, live)

    def decisions(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.log_path.read_text().splitlines()]

    def close(self) -> None:
        for sock in [self.client, *self.workers.values()]:
            sock.close()
        self.router.close()


class FakeBackend:
    name = "fake"
    device = "fake"
    model_name = "fake.gguf"
    vocab_size = 1000

    def __init__(self, n_ctx: int = 4096, kv_cells: int | None = None) -> None:
        self.n_ctx = n_ctx
        self.kv_cells = kv_cells  # None: never full
        self.kv: dict[int, list[int]] = {}  # seq -> tokens whose "KV" it holds
        self.next_seq = 0
        self.steps: list[tuple[list[str], list[tuple[str, int]]]] = []
        self.fed = 0  # prompt tokens actually computed
        self.script: dict[str, list[int]] = {}  # request id -> tokens to produce

    def begin(self, req: Request, match: Match) -> None:
        self.next_seq += 1
        self.kv[self.next_seq] = (
            list(self.kv[match.entry.handle][: match.n_tokens]) if match.entry else []
        )
        req.slot = self.next_seq

    def live_handle(self, req: Request) -> int:
        return req.slot

    def run(self, decode, prefill):
        self.steps.append(([r.id for r in decode], [(r.id, n) for r, n in prefill]))
        need = len(decode) + sum(n for _, n in prefill)
        if self.kv_cells is not None and self.used() + need > self.kv_cells:
            self.steps.pop()
            raise KVFull()
        out = {}
        for r in decode:
            self.kv[r.slot].append(r.output[-1])
            out[r.id] = self._next(r)
        for r, n in prefill:
            self.kv[r.slot] += r.prompt[r.n_computed : r.n_computed + n]
            self.fed += n
            if r.n_computed + n == len(r.prompt) and not r.prefill_only:
                out[r.id] = self._next(r)
        return out

    def _next(self, r: Request) -> int:
        script = self.script.get(r.id)
        if script is not None:
            return script[len(r.output)] if len(r.output) < len(script) else EOS
        return 100 + len(r.output)

    def used(self) -> int:
        return sum(len(v) for v in self.kv.values())

    def end(self, req: Request) -> int:
        assert self.kv[req.slot] == req.kv_tokens(), "engine and backend disagree on KV"
        return req.slot

    def free(self, handle: int) -> None:
        del self.kv[handle]

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return token == EOS


def greedy_reference(
    model_path: str,
    prompt: list[int],
    n_out: int,
    chunk: int,
    n_ctx: int = 8192,
    threads: int = 2,
    n_seq_max: int = 21,
) -> list[int]:
    """Prefill ``prompt`` in chunks of ``chunk`` tokens, then greedy-decode ``n_out`` tokens.

    A direct llama.cpp loop written independently of workers/, for parity tests.
    """
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, chunk, chunk, n_seq_max
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    batch = L.llama_batch_init(chunk, 0, 1)

    def feed(tokens: list[int], start: int) -> None:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = int(i == len(tokens) - 1)
        batch.n_tokens = len(tokens)
        assert L.llama_decode(ctx, batch) == 0

    def argmax_last() -> int:
        logits = L.llama_get_logits_ith(ctx, -1)
        row = (ctypes.c_float * n_vocab).from_address(ctypes.addressof(logits.contents))
        return max(range(n_vocab), key=row.__getitem__)

    try:
        for s in range(0, len(prompt), chunk):
            feed(prompt[s : s + chunk], s)
        out = [argmax_last()]
        while len(out) < n_out and not L.llama_vocab_is_eog(vocab, out[-1]):
            feed([out[-1]], len(prompt) + len(out) - 1)
            out.append(argmax_last())
        return out
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


def wait_for(client: Any, check: Any, timeout_s: float = 20.0) -> None:
    """Poll the router's status until ``check(workers)`` holds (heartbeats arrive on
    their own schedule: state is awaited, never assumed after a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check(client.status().workers):
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out; last status: {client.status().workers}")
