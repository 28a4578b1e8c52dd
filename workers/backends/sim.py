"""A SIMULATED device: speaks the backend interface, runs no model, only advances time.

For routing tests and benchmarks with many heterogeneous workers on a small
machine. Every step sleeps for what the profile says the step would take on the
modelled device, then returns deterministic token ids. The engine around it is
the real one (queue, ``max_active`` cap, prefix cache), so a prefix-cache hit
really shortens the prefill the sim sleeps for. Its device label is
``sim-<profile name>``. Never use its timings as a performance claim: they are
the profile's numbers played back.

The device model itself (the profile file, a step's cost, the tokens) is the
twin's too: workers/device_model.py. What is this backend's own: the real clock
(below) and the real model's tokenizer, so a sim worker joins a router serving it.

The sim keeps a device clock: back-to-back steps end ``cost`` apart on it, and
the host time the engine spends between them (bookkeeping, emitting tokens,
sleep overshoot) overlaps the device's, so the step *period* is ``max(cost, host
time)``. A profile measured through the engine (``tandem profile``) already
contains that overhead and must not pay it twice. After the worker ran out of
requests the clock restarts from now (idle time is not device time).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.common.gguf_file import weights_digest
from tandem.common.tokenizer import TokenizerSpec, piece_table, tokenizer_spec_from_gguf
from tandem.workers.device_model import SimDevice, SimProfile

if TYPE_CHECKING:
    from tandem.workers.config import WorkerConfig
    from tandem.workers.request import Request

log = logging.getLogger(__name__)


class SimBackend(SimDevice):
    """A SimDevice on the real clock: each step sleeps for its cost."""

    @classmethod
    def from_config(cls, cfg: WorkerConfig, model: Path) -> SimBackend:
        if not cfg.profile:
            raise ValueError("the sim backend needs --profile FILE (or a bundled profile name)")
        return cls(cfg.profile, n_ctx=cfg.n_ctx, model=model)

    def __init__(
        self, profile_path: str | Path, n_ctx: int = 8192, model: str | Path | None = None
    ) -> None:
        from tandem.common.model_files import default_model_path

        model_path = Path(model) if model else default_model_path()
        spec = tokenizer_spec_from_gguf(model_path)
        self._pieces = piece_table(spec)
        super().__init__(SimProfile.load(profile_path), n_ctx, len(self._pieces),
                         frozenset(spec.eos_ids))  # fmt: skip
        # The real model's name and tokenizer: the sim joins a router serving that model.
        self.model_name = model_path.name
        self.weights_digest = weights_digest(model_path)
        self.tokenizer_spec: TokenizerSpec = spec
        self._free_at = 0.0  # device clock: monotonic time the previous step ended
        self._idle = True  # the worker had no request since that step
        log.warning(
            "SIMULATED device %s: timings are played back from %s, no model runs",
            self.device,
            profile_path,
        )

    @property
    def profile_rates(self) -> tuple[float, list[float]]:
        """(prefill tok/s, decode tok/s by batch size): the rates this device advertises."""
        return self.profile.prefill_tok_s, self.profile.decode_tok_s()

    def end(self, req: Request) -> int:
        handle = super().end(req)
        self._idle = self._live == 0
        return handle

    def advance(self, cost_s: float) -> None:
        now = time.monotonic()
        start = now if self._idle else max(self._free_at, now - cost_s)
        self._free_at = start + cost_s
        if self._free_at > now:
            time.sleep(self._free_at - now)
        self._idle = False

    def piece(self, token: int) -> bytes:
        return self._pieces[token]
