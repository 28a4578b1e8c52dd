"""The one model of a simulated device, shared by the sim backend (a worker process
that sleeps through each step: workers/backends/sim.py) and the twin (a device on a
virtual clock: twin/device.py). Both run the real engine around a ``SimDevice``; they
differ only in how a step's cost passes (``SimDevice.advance``) and in the tokenizer
they carry, so a change to the model shows in both.

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

The sim backend keeps a device clock: back-to-back steps end ``cost`` apart on it, and
the host time the engine spends between them (bookkeeping, emitting tokens,
sleep overshoot) overlaps the device's, so the step *period* is ``max(cost, host
time)``. A profile measured through the engine (``tandem profile``) already
contains that overhead and must not pay it twice. After the worker ran out of
requests the clock restarts from now (idle time is not device time).

Output token ids depend only on the prompt and the output position (like greedy
decoding) and are never end-of-generation ids, so requests run to max_tokens.
The sim does not model a KV pool: it never raises KVFull (the engine still caps
active requests by their n_ctx reservations and the prefix cache by its budget).
A ``Tail`` makes the device's step costs right-skewed, as the H200's GPU ran
(its slowest tenth of decode steps 1.4-2.7x its median step): every ``every``-th
step costs ``x`` times the profile's. Deterministic, so replays stay comparable.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tandem.workers.memory import ModelledMemory
from tandem.workers.prefix_cache import Match
from tandem.workers.request import Request, decode_context

_PROFILE_KEYS = {"name", "prefill_tok_s", "decode_step_s", "decode_context_s", "note", "source",
                 "memory"}  # fmt: skip
_FIRST_OUTPUT_ID = 256  # below this sit control tokens and single bytes: keep output readable


BUNDLED_PROFILES = Path(__file__).resolve().parent / "backends" / "profiles"


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


@dataclass(frozen=True)
class Tail:
    """Every ``every``-th step of a device costs ``x`` times what its profile says."""

    every: int
    x: float

    def __post_init__(self) -> None:
        if self.every < 2 or not self.x > 0:
            raise ValueError("a tail needs every >= 2 and x > 0")

    @property
    def mean_factor(self) -> float:
        """A long run of steps costs this many times the profile's."""
        return (self.every - 1 + self.x) / self.every

    def steady(self, profile: SimProfile) -> SimProfile:
        """A device without the tail that runs a long run of steps in the same time."""
        f = self.mean_factor
        return replace(
            profile,
            prefill_tok_s=profile.prefill_tok_s / f,
            decode_step_s=tuple(s * f for s in profile.decode_step_s),
            decode_context_s=profile.decode_context_s * f,
        )


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


class SimDevice:
    """The Backend interface of workers/engine.py over a ``SimProfile``: deterministic
    token ids, cache handles with the KV tokens each holds, and each step's cost from
    the profile (and the tail). How that cost passes is the subclass's: ``advance``."""

    name = "sim"
    # Simulated tokens: it honours none of the sampling extras, so it advertises none
    # and the router sends it no request that asks for one.
    capabilities: tuple[str, ...] = ()

    def __init__(self, profile: SimProfile, n_ctx: int, vocab_size: int,
                 eog: frozenset[int] = frozenset(), tail: Tail | None = None) -> None:  # fmt: skip
        self.profile = profile
        self.tail = tail
        self.device = f"sim-{profile.name}"
        self.n_ctx = n_ctx
        self.vocab_size = vocab_size
        self._eog = eog
        self.steps = 0
        self.busy_s = 0.0  # total simulated device time, for checks and profiling
        self._live = 0  # requests between begin and end
        self._lengths: dict[int, int] = {}  # KV tokens of each live cache handle
        self._next_handle = 0

    def advance(self, cost_s: float) -> None:
        """Let ``cost_s`` seconds of device time pass (sleep, or move a virtual clock)."""
        raise NotImplementedError

    # ------------------------------------------------------------ slots
    def begin(self, req: Request, match: Match) -> None:
        # The engine already counts match.n_tokens as computed: only the rest costs time.
        # Keyed on the prompt before any migrated output, with output positions counted
        # from there (``sampled``): a migrated stream continues exactly as greedy would.
        prompt = req.prompt[: len(req.prompt) - req.resumed]
        digest = hashlib.blake2b(array("q", prompt).tobytes(), digest_size=8).digest()
        req.slot = int.from_bytes(digest, "little")
        self._live += 1

    def end(self, req: Request) -> int:
        req.slot = None
        self._live -= 1
        handle = self._new_handle()
        self._lengths[handle] = len(req.kv_tokens())
        return handle

    def free(self, handle: int) -> None:
        if handle not in self._lengths:  # catches engine double-frees, as llama.cpp would
            raise RuntimeError(f"{self.device}: freeing unknown cache handle {handle}")
        del self._lengths[handle]

    def held_tokens(self, handle: int) -> int:
        return self._lengths.get(handle, 0)

    def _new_handle(self) -> int:
        self._next_handle += 1
        self._lengths[self._next_handle] = 0
        return self._next_handle

    # ------------------------------------------------------------ the step
    def run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        cost_s = self.profile.step_cost_s(decode, prefill)
        self.steps += 1
        if self.tail is not None and self.steps % self.tail.every == 0:
            cost_s *= self.tail.x
        self.advance(cost_s)
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

    def is_eog(self, token: int) -> bool:
        return token in self._eog
