"""A simulated device on a virtual clock: the sim backend's device model, with no sleep.

``TwinDevice`` is the one simulated device model (workers/device_model.py
``SimDevice``: the profile's step costs, its tail, the tokens, the cache handles)
that the sim backend also runs, but instead of sleeping it moves its owner's
virtual clock forward by the cost of each step. The engine around it is the real
one, so queueing, admission, chunked prefill, batching and the prefix cache behave
as in a worker process.

It carries no tokenizer (the twin never detokenizes for a person): every token
is one placeholder byte, and no id is an end-of-generation id, so requests run
to ``max_tokens`` as with ``ignore_eos``.
"""

from __future__ import annotations

from typing import Protocol

from tandem.workers.config import EngineConfig
from tandem.workers.device_model import SimDevice, SimProfile, Tail
from tandem.workers.memory import llama_sequences

__all__ = ["Tail", "TwinDevice", "TwinHostDevice", "TwinLlamaDevice", "twin_device"]

VOCAB_SIZE = 49152  # the embedded model's vocabulary: prompts cut from its tokenizer fit


class Clocked(Protocol):
    """Whoever owns the virtual clock the device advances."""

    now: float


class TwinDevice(SimDevice):
    """A SimDevice whose steps advance ``owner.now`` instead of sleeping."""

    model_name = "twin"

    def __init__(
        self, profile: SimProfile, owner: Clocked, n_ctx: int = 1 << 30, tail: Tail | None = None
    ) -> None:
        super().__init__(profile, n_ctx, VOCAB_SIZE, tail=tail)
        self.owner = owner

    def advance(self, cost_s: float) -> None:
        self.owner.now += cost_s

    def piece(self, token: int) -> bytes:
        return b"."


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
        self.advance(cost_s)
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
