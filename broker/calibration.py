"""What the policy sees beyond the advertised numbers: live pricing and output length.

Both are router options and change only what the policy *sees*: the requests
themselves still carry their real ``max_tokens``.

Rates (``--calibrate``, the default): each worker is priced by its live
step-time model where it has samples, its profile elsewhere
(``common/pricing.py``); ``--no-calibrate`` prices by the (repaired) profile
alone. This replaced an earlier request-level calibration that rescaled the
profile by what whole requests took (docs/ROUTING.md says why).

Output length (``--decode-estimate ratio``): every decode budget the policy
sees, the new request's and those still outstanding on each worker, is scaled
by the ratio of realized to requested tokens over recently finished requests
(the idea of SGLang's ``new_token_ratio``). ``budget`` (the default) uses
``max_tokens`` as is.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from tandem.broker.policies import Load, RouteRequest, WorkerView
from tandem.common import protocol as p

DECODE_ESTIMATES = ("budget", "ratio")
RATIO_WINDOW = 64  # finished requests the output ratio is computed over
RATIO_MIN_SAMPLES = 4
RATIO_FLOOR = 0.05  # never assume requests produce (almost) nothing


class Calibration:
    """Per-router state for ``--calibrate`` and ``--decode-estimate``."""

    def __init__(self, calibrate: bool = True, decode_estimate: str = "budget") -> None:
        if decode_estimate not in DECODE_ESTIMATES:
            raise ValueError(f"decode_estimate must be one of {DECODE_ESTIMATES}")
        self.calibrate = calibrate  # price with live step times (registry.WorkerState.rates)
        self.decode_estimate = decode_estimate
        self._outputs: deque[tuple[int, int]] = deque(maxlen=RATIO_WINDOW)  # (realized, asked)
        # Bumped whenever what adjust() returns may change: cached views key on it.
        self.version = 0

    def on_done(self, stats: p.DoneStats, finish_reason: str, max_tokens: int) -> None:
        """A request finished: remember how much of its budget it used."""
        output = stats.output_tokens or 0
        if max_tokens > 0 and finish_reason in ("eos", "stop", "length"):
            self._outputs.append((output, max_tokens))
            if self.decode_estimate == "ratio":
                self.version += 1  # the ratio adjust() scales budgets by moved

    # ------------------------------------------------------------ what the policy sees
    @property
    def ratio(self) -> float:
        """Realized / requested output tokens over recent requests (1.0 until known)."""
        if self.decode_estimate != "ratio" or len(self._outputs) < RATIO_MIN_SAMPLES:
            return 1.0
        realized = sum(o for o, _ in self._outputs)
        asked = sum(a for _, a in self._outputs)
        return min(1.0, max(RATIO_FLOOR, realized / asked))

    def route_request(
        self, prompt_tokens: int, max_tokens: int, arrivals_before: tuple[float, ...] = ()
    ) -> RouteRequest:
        """The request as the policy should price it."""
        return RouteRequest(prompt_tokens, self._scale(max_tokens), arrivals_before)

    def adjust(self, view: WorkerView) -> WorkerView:
        """``view`` with estimated decode budgets, when enabled."""
        if self.ratio != 1.0:
            view = view.replace(
                active=tuple(
                    Load(x.prefill_remaining, self._scale(x.decode_remaining)) for x in view.active
                ),
                queued=tuple(
                    Load(x.prefill_remaining, self._scale(x.decode_remaining)) for x in view.queued
                ),
            )
        return view

    def _scale(self, budget: int) -> int:
        r = self.ratio
        return budget if r == 1.0 or budget <= 0 else max(1, math.ceil(budget * r))

    def log_fields(self) -> dict[str, Any]:
        """Extra fields of a decision record (none when both options are off)."""
        if not self.calibrate and self.decode_estimate == "budget":
            return {}
        return {
            "calibrated": self.calibrate,
            "decode_estimate": self.decode_estimate,
            "decode_ratio": round(self.ratio, 4),
        }
