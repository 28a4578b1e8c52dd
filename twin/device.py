"""A simulated device on a virtual clock: the sim backend's timings, with no sleep.

``TwinDevice`` speaks the engine's Backend interface (workers/engine.py) like
workers/backends/sim.py does and plays back the same ``SimProfile`` step costs,
but instead of sleeping it moves its owner's virtual clock forward by the cost
of each step. The engine around it is the real one, so queueing, admission,
chunked prefill, batching and the prefix cache behave as in a worker process.

A ``Tail`` makes the device's step costs right-skewed, as the H200's GPU ran
(its slowest tenth of decode steps 1.4-2.7x its median step): every ``every``-th
step costs ``x`` times the profile's. Deterministic, so replays stay comparable.

It carries no tokenizer (the twin never detokenizes for a person): every token
is one placeholder byte, and no id is an end-of-generation id, so requests run
to ``max_tokens`` as with ``ignore_eos``.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, replace
from typing import Protocol

from tandem.workers.backends.sim import SimProfile, sampled
from tandem.workers.config import EngineConfig
from tandem.workers.memory import llama_sequences
from tandem.workers.prefix_cache import Match
from tandem.workers.request import Request

VOCAB_SIZE = 49152  # the embedded model's vocabulary: prompts cut from its tokenizer fit
_FIRST_OUTPUT_ID = 256


class Clocked(Protocol):
    """Whoever owns the virtual clock the device advances."""

    now: float


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


class TwinDevice:
    """EngineBackend over a SimProfile whose steps advance ``owner.now`` instead of sleeping."""

    name = "sim"
    model_name = "twin"
    vocab_size = VOCAB_SIZE
    capabilities: tuple[str, ...] = ()  # plain sampling, as the sim backend's

    def __init__(
        self, profile: SimProfile, owner: Clocked, n_ctx: int = 1 << 30, tail: Tail | None = None
    ) -> None:
        self.profile = profile
        self.tail = tail
        self.steps = 0
        self.device = f"sim-{profile.name}"
        self.owner = owner
        self.n_ctx = n_ctx
        self.busy_s = 0.0  # device seconds spent, for checks
        self._handles: set[int] = set()
        self._lengths: dict[int, int] = {}  # KV tokens of each live handle
        self._next_handle = 0

    def begin(self, req: Request, match: Match) -> None:
        digest = hashlib.blake2b(array("q", req.prompt).tobytes(), digest_size=8).digest()
        req.slot = int.from_bytes(digest, "little")

    def run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        cost_s = self.profile.step_cost_s(decode, prefill)
        self.steps += 1
        if self.tail is not None and self.steps % self.tail.every == 0:
            cost_s *= self.tail.x
        self.owner.now += cost_s
        self.busy_s += cost_s
        return sampled(decode, prefill, self._token)

    def end(self, req: Request) -> int:
        req.slot = None
        handle = self._new_handle()
        self._lengths[handle] = len(req.kv_tokens())
        return handle

    def free(self, handle: int) -> None:
        if handle not in self._handles:  # an engine double-free, as the sim would catch
            raise RuntimeError(f"twin: freeing unknown cache handle {handle}")
        self._handles.remove(handle)
        self._lengths.pop(handle, None)

    def _new_handle(self) -> int:
        self._next_handle += 1
        self._handles.add(self._next_handle)
        return self._next_handle

    def piece(self, token: int) -> bytes:
        return b"."

    def held_tokens(self, handle: int) -> int:
        return self._lengths.get(handle, 0)

    def is_eog(self, token: int) -> bool:
        return False

    @staticmethod
    def _token(seed: int, position: int) -> int:
        return _FIRST_OUTPUT_ID + (seed + position * 7919) % (VOCAB_SIZE - _FIRST_OUTPUT_ID)


class TwinHostDevice(TwinDevice):
    """A TwinDevice with a host-RAM tier behind its cache: an evicted entry is saved
    (its token count: the twin holds no KV) and a restore costs ``tokens /
    restore_tok_s`` of device time (workers/host_cache.py). It stands for MLX on a
    CUDA GPU (its arrays copied to host RAM), where the profile gives the rate."""

    def __init__(self, profile: SimProfile, owner: Clocked, restore_tok_s: float | None,
                 tail: Tail | None = None) -> None:  # fmt: skip
        super().__init__(profile, owner, tail=tail)
        self.restore_tok_s = restore_tok_s
        self.restored_tokens = 0

    def save(self, handle: int) -> int | None:
        """The saved state is the token count; None (nothing kept) without a rate."""
        return self.held_tokens(handle) if self.restore_tok_s else None

    def restore(self, state: int) -> int:
        assert self.restore_tok_s is not None  # save gave no state otherwise
        cost_s = state / self.restore_tok_s
        self.owner.now += cost_s
        self.busy_s += cost_s
        self.restored_tokens += state
        handle = self._new_handle()
        self._lengths[handle] = state
        return handle


class TwinLlamaDevice(TwinHostDevice):
    """A TwinHostDevice standing for a llama.cpp worker: its cache entries are also
    sequence ids (``max_cache_entries``); its host tier is llama.cpp's saved sequence
    states."""

    def __init__(self, profile: SimProfile, owner: Clocked, max_cache_entries: int,
                 restore_tok_s: float | None, tail: Tail | None = None) -> None:  # fmt: skip
        super().__init__(profile, owner, restore_tok_s, tail=tail)
        self.max_cache_entries = max_cache_entries


def twin_device(profile: SimProfile, owner: Clocked, engine: EngineConfig,
                tail: Tail | None = None) -> TwinDevice:  # fmt: skip
    """The device a twin worker runs on, as the profile's memory (workers/memory.py
    ``ModelledMemory``) says: a llama.cpp one, MLX on a CUDA GPU with a host tier
    where the profile gives its restore rate, else a plain one (MLX on Metal or a
    CPU keeps its arrays in host memory already: no tier to restore from)."""
    mem = profile.memory
    if mem is None:
        return TwinDevice(profile, owner, tail=tail)
    if mem.backend == "llama.cpp":
        seqs = llama_sequences(engine.max_active, engine.cache_entries, engine.step_tokens)
        entries = seqs - engine.max_active - 1  # the sequence ids the active rows leave
        return TwinLlamaDevice(profile, owner, entries, mem.restore_tok_s, tail)
    if mem.device == "gpu-cuda" and mem.restore_tok_s:
        return TwinHostDevice(profile, owner, mem.restore_tok_s, tail)
    return TwinDevice(profile, owner, tail=tail)
