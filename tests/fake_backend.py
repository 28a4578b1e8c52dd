"""A fake model backend for engine unit tests: deterministic tokens, counted work.

Not a simulated device (that is workers/sim_backend.py): it has no timing at all,
it only records what the engine asked it to compute.
"""

from __future__ import annotations

from workers.engine import KVFull
from workers.prefix_cache import Match
from workers.request import Request

EOS = 0


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
