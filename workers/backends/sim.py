"""A SIMULATED device: speaks the backend interface, runs no model, only advances time.

For routing tests and benchmarks with many heterogeneous workers on a small
machine. Every step sleeps for what the profile says the step would take on the
modelled device, then returns deterministic token ids. The engine around it is
the real one (queue, ``max_active`` cap, prefix cache), so a prefix-cache hit
really shortens the prefill the sim sleeps for. Its device label is
``sim-<profile name>``. Never use its timings as a performance claim: they are
the profile's numbers played back.

Profile file (JSON; bundled in workers/backends/profiles/)::

    {"name": "gpu-m2",             # label: the device becomes "sim-gpu-m2"
     "prefill_tok_s": 2551,        # prompt tokens per second
     "decode_step_s": [0.00341, 0.00375, ...],   # seconds of one decode step
                                   # with 1, 2, ... requests in the batch
     "decode_context_s": 4.8e-6,   # optional: extra seconds per decode step per
                                   # context token of each decoding row (default 0)
     "note": "...",                # optional free text (assumptions, source)
     "memory": {"backend": "mlx", "device": "gpu-cuda", "device_gib": 139,
                "host_gib": 128, "restore_tok_s": null}}
                                   # optional: what the twin sizes the prefix cache
                                   # from, as that backend would (workers/memory.py)

A step costs ``prefill_tokens / prefill_tok_s + decode_step_s[b - 1] +
decode_context_s * context`` where b is the number of decode rows and context
the KV tokens they attend over, summed (``decode_context``; the decode terms
only when b > 0): attention reads every cached token, so decode slows as
contexts grow, as a real device does (llama.cpp on the H200 box's CPU decoded
~2x slower after 516 tokens than after 16). Beyond the end
of ``decode_step_s`` the aggregate decode rate is assumed to plateau (the step
time grows linearly with b). ``decode_step_s`` may also be a single number (the
same step time at every batch size).

The sim keeps a device clock: back-to-back steps end ``cost`` apart on it, and
the host time the engine spends between them (bookkeeping, emitting tokens,
sleep overshoot) overlaps the device's, so the step *period* is ``max(cost, host
time)``. A profile measured through the engine (``tandem profile``) already
contains that overhead and must not pay it twice. After the worker ran out of
requests the clock restarts from now (idle time is not device time).

Output token ids depend only on the prompt and the output position (like greedy
decoding) and are never end-of-generation ids, so requests run to max_tokens.
The sim does not model a KV pool: it never raises KVFull (the engine still caps
active requests by their n_ctx reservations and the prefix cache by its budget).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.common.gguf_file import weights_digest
from tandem.common.tokenizer import TokenizerSpec, piece_table, tokenizer_spec_from_gguf
from tandem.workers.memory import ModelledMemory
from tandem.workers.prefix_cache import Match
from tandem.workers.request import Request, decode_context

if TYPE_CHECKING:
    from tandem.workers.config import WorkerConfig

log = logging.getLogger(__name__)

_PROFILE_KEYS = {"name", "prefill_tok_s", "decode_step_s", "decode_context_s", "note", "source",
                 "memory"}  # fmt: skip
_FIRST_OUTPUT_ID = 256  # below this sit control tokens and single bytes: keep output readable


BUNDLED_PROFILES = Path(__file__).resolve().parent / "profiles"


def resolve_profile(name_or_path: str | Path) -> Path:
    """A profile file as given, else the bundled profile of that name (``gpu-m2``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = BUNDLED_PROFILES / f"{path.name.removesuffix('.json')}.json"
    return bundled if bundled.is_file() else path


@dataclass(frozen=True)
class SimProfile:
    """How fast the simulated device is (see the module docstring for the file format)."""

    name: str
    prefill_tok_s: float
    decode_step_s: tuple[float, ...]  # seconds per decode step at batch size 1, 2, ...
    decode_context_s: float = 0.0  # extra seconds per decode step per context token per row
    memory: ModelledMemory | None = None  # what the twin sizes its caches from (workers/memory.py)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError("profile name must be a non-empty label without '/'")
        if not self.prefill_tok_s > 0:
            raise ValueError("prefill_tok_s must be > 0")
        if not self.decode_step_s or min(self.decode_step_s) <= 0:
            raise ValueError("decode_step_s must be positive seconds")
        if not 0 <= self.decode_context_s <= 1:
            raise ValueError("decode_context_s must be in [0, 1] seconds per context token")

    @classmethod
    def load(cls, path: str | Path) -> SimProfile:
        """Read and validate a profile file, or a bundled one by name (``gpu-m2``);
        ValueError names the problem."""
        path = resolve_profile(path)
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read sim profile {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"sim profile {path} must be a JSON object")
        unknown = sorted(set(data) - _PROFILE_KEYS)
        if unknown:
            raise ValueError(f"sim profile {path}: unknown key(s) {unknown}")
        steps = data.get("decode_step_s")
        steps = steps if isinstance(steps, list) else [steps]
        try:
            return cls(
                str(data.get("name") or Path(path).stem),
                float(data["prefill_tok_s"]),
                tuple(float(x) for x in steps),
                float(data.get("decode_context_s", 0.0)),
                ModelledMemory.from_json(data["memory"]) if "memory" in data else None,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"sim profile {path}: missing or bad field {exc}") from None

    def step_s(self, batch: int) -> float:
        """Seconds of one decode step with ``batch`` rows (0 rows: no decode cost)."""
        if batch <= 0:
            return 0.0
        n = len(self.decode_step_s)
        if batch <= n:
            return self.decode_step_s[batch - 1]
        return self.decode_step_s[-1] * batch / n  # aggregate rate plateaus past the table

    def cost_s(self, prefill_tokens: int, decode_batch: int, context_tokens: int = 0) -> float:
        """Seconds one engine step takes on the modelled device; ``context_tokens``: the
        KV tokens its decode rows attend over, summed (``decode_context``)."""
        decode_s = self.step_s(decode_batch) + self.decode_context_s * context_tokens
        return prefill_tokens / self.prefill_tok_s + decode_s

    def step_cost_s(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> float:
        """``cost_s`` of one engine step given its rows (the backend ``run`` arguments)."""
        return self.cost_s(sum(n for _, n in prefill), len(decode), decode_context(decode))

    def decode_tok_s(self) -> list[float]:
        """Aggregate decode tok/s at batch size 1, 2, ... (what a worker advertises)."""
        return [b / self.step_s(b) for b in range(1, len(self.decode_step_s) + 1)]


def sampled(
    decode: list[Request], prefill: list[tuple[Request, int]], token: Callable[[int, int], int]
) -> dict[str, int]:
    """The ids one step yields: every decode row's next token and the first token of each
    prefill that reaches its end in this step; ``token(slot, position)`` picks an id."""
    out = {r.id: token(r.slot, r.resumed + len(r.output)) for r in decode}
    for r, n in prefill:
        if r.n_computed + n == len(r.prompt) and not r.prefill_only:
            out[r.id] = token(r.slot, r.resumed)  # a migrated stream goes on where it was
    return out


class SimBackend:
    """The Backend interface of workers/engine.py, played back from a SimProfile."""

    name = "sim"
    # Simulated tokens: it honours none of the sampling extras, so it advertises none
    # and the router sends it no request that asks for one.
    capabilities: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: WorkerConfig, model: Path) -> SimBackend:
        if not cfg.profile:
            raise ValueError("the sim backend needs --profile FILE (or a bundled profile name)")
        return cls(cfg.profile, n_ctx=cfg.n_ctx, model=model)

    def __init__(
        self, profile_path: str | Path, n_ctx: int = 8192, model: str | Path | None = None
    ) -> None:
        from tandem.common.model_files import default_model_path

        self.profile = SimProfile.load(profile_path)
        self.device = f"sim-{self.profile.name}"
        model_path = Path(model) if model else default_model_path()
        # The real model's name and tokenizer: the sim joins a router serving that model.
        self.model_name = model_path.name
        self.weights_digest = weights_digest(model_path)
        self.n_ctx = n_ctx
        self.tokenizer_spec: TokenizerSpec = tokenizer_spec_from_gguf(model_path)
        self._pieces = piece_table(self.tokenizer_spec)
        self.vocab_size = len(self._pieces)
        self._eog = set(self.tokenizer_spec.eos_ids)
        self._handles: set[int] = set()
        self._next_handle = 0
        self._live = 0  # requests between begin and end
        self._free_at = 0.0  # device clock: monotonic time the previous step ended
        self._idle = True  # the worker had no request since that step
        self.busy_s = 0.0  # total simulated device time, for checks and profiling
        log.warning(
            "SIMULATED device %s: timings are played back from %s, no model runs",
            self.device,
            profile_path,
        )

    @property
    def profile_rates(self) -> tuple[float, list[float]]:
        """(prefill tok/s, decode tok/s by batch size): the rates this device advertises."""
        return self.profile.prefill_tok_s, self.profile.decode_tok_s()

    # ------------------------------------------------------------ slots
    def begin(self, req: Request, match: Match) -> None:
        # The engine already counts match.n_tokens as computed: only the rest is slept for.
        # Keyed on the prompt before any migrated output, with output positions counted
        # from there (run below): a migrated stream continues exactly as greedy would.
        prompt = req.prompt[: len(req.prompt) - req.resumed]
        digest = hashlib.blake2b(array("q", prompt).tobytes(), digest_size=8).digest()
        req.slot = int.from_bytes(digest, "little")
        self._live += 1

    def end(self, req: Request) -> int:
        req.slot = None
        self._live -= 1
        self._idle = self._live == 0
        self._next_handle += 1
        self._handles.add(self._next_handle)
        return self._next_handle

    def free(self, handle: int) -> None:
        if handle not in self._handles:  # catches engine double-frees, as llama.cpp would
            raise RuntimeError(f"sim: freeing unknown cache handle {handle}")
        self._handles.remove(handle)

    # ------------------------------------------------------------ the step
    def run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        cost_s = self.profile.step_cost_s(decode, prefill)
        now = time.monotonic()
        start = now if self._idle else max(self._free_at, now - cost_s)
        self._free_at = start + cost_s
        if self._free_at > now:
            time.sleep(self._free_at - now)
        self._idle = False
        self.busy_s += cost_s
        return sampled(decode, prefill, self._token)

    def _token(self, seed: int, position: int) -> int:
        """A deterministic, never end-of-generation id for output ``position``."""
        x = (seed ^ (position * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF
        x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        span = self.vocab_size - _FIRST_OUTPUT_ID
        token = _FIRST_OUTPUT_ID + (x >> 17) % span
        while token in self._eog:
            token = _FIRST_OUTPUT_ID + (token + 1 - _FIRST_OUTPUT_ID) % span
        return token

    # ------------------------------------------------------------ tokens
    def piece(self, token: int) -> bytes:
        return self._pieces[token]

    def is_eog(self, token: int) -> bool:
        return token in self._eog
