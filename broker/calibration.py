"""Online calibration of worker rates and the output-length estimate (router side).

Both are options of the router and change only what the policy *sees*: the
requests themselves still carry their real ``max_tokens``.

Rates (``--calibrate``, on by default; ``--no-calibrate`` prices by the advertised
rates alone): each finished request is one measurement. Its decode took
``decode_s`` for ``output_tokens - 1`` steps while about ``b`` requests decoded
together (b = the time-weighted mean of the active counts the worker's heartbeats
reported over that window), so the worker's aggregate decode rate at batch b is
``b * (output_tokens - 1) / decode_s``. Its prefill computed ``prompt_tokens -
cached_tokens`` in ``prefill_s``; that is the device's prefill rate only when the
request had the worker to itself, so prefill is measured from such requests
alone (seed requests, quiet periods). Each measurement moves a per-batch-size
*factor* (measured / advertised) by an exponential moving average; batch sizes
never observed borrow the nearest observed factor, so the profile's shape is
kept while its level follows reality. A request still decoding is measured the
same way at 16 relayed tokens and every 32 after (router clock), so a burst is
priced by what the workers deliver during it, not only by what already finished.

Output length (``--decode-estimate ratio``): every decode budget the policy
sees, the new request's and those still outstanding on each worker, is scaled
by the ratio of realized to requested tokens over recently finished requests
(the idea of SGLang's ``new_token_ratio``). ``budget`` (the default) uses
``max_tokens`` as is.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tandem.broker.policies import Load, RouteRequest, WorkerView

DECODE_ESTIMATES = ("budget", "ratio")
ALPHA = 0.3  # EWMA weight of a new measurement: a few requests move the factor
MIN_PREFILL_TOKENS = 32  # shorter prefills are dominated by step overhead
MIN_OUTPUT_TOKENS = 8
PROGRESS_FIRST, PROGRESS_EVERY = 16, 32  # mid-flight decode samples: at 16 tokens, every 32
ALONE = 1.25  # mean active count at which a prefill counts as "had the worker alone"
RATIO_WINDOW = 64  # finished requests the output ratio is computed over
RATIO_MIN_SAMPLES = 4
RATIO_FLOOR = 0.05  # never assume requests produce (almost) nothing
HISTORY_S = 300.0  # heartbeat samples kept per worker


@dataclass
class WorkerRates:
    """Advertised rates of one worker and the factors measured against them."""

    prefill_tok_s: float
    decode_tok_s: tuple[float, ...]
    prefill_factor: float | None = None
    decode_factor: dict[int, float] = field(default_factory=dict)  # batch size -> factor
    active: deque[tuple[float, int]] = field(default_factory=deque)  # (time, active count)

    def prefill(self) -> float:
        return self.prefill_tok_s * (self.prefill_factor or 1.0)

    def decode(self) -> tuple[float, ...]:
        if not self.decode_factor:
            return self.decode_tok_s
        seen = sorted(self.decode_factor)
        out = []
        for b, rate in enumerate(self.decode_tok_s, 1):
            nearest = min(seen, key=lambda s: (abs(s - b), s))
            out.append(rate * self.decode_factor[nearest])
        return tuple(out)

    def mean_active(self, t0: float, t1: float) -> float | None:
        """Time-weighted mean active count over [t0, t1], from heartbeat samples."""
        if t1 <= t0 or not self.active:
            return None
        window = []  # newest first: the samples inside (t0, t1), then the last one before
        for t, n in reversed(self.active):  # a window is recent: do not walk all history
            if t < t1:
                window.append((t, n))
                if t <= t0:
                    break
        total, prev_t, prev_n = 0.0, t0, None
        for t, n in reversed(window):
            if t <= t0:
                prev_n = n
                continue
            if prev_n is not None:
                total += prev_n * (t - prev_t)
            prev_t, prev_n = t, n
        if prev_n is None:
            return None
        total += prev_n * (t1 - prev_t)
        covered = t1 - max(t0, self.active[0][0])
        return total / covered if covered > 0 else None


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else (1 - ALPHA) * old + ALPHA * sample


def _interpolate(rates: tuple[float, ...], batch: float) -> float:
    """Aggregate rate at a fractional mean batch size (linear; plateau past the table)."""
    if batch >= len(rates):
        return rates[-1]
    lo = int(batch)  # >= 1
    return rates[lo - 1] + (rates[lo] - rates[lo - 1]) * (batch - lo)


class Calibration:
    """Per-router state for ``--calibrate`` and ``--decode-estimate``."""

    def __init__(self, calibrate: bool = False, decode_estimate: str = "budget") -> None:
        if decode_estimate not in DECODE_ESTIMATES:
            raise ValueError(f"decode_estimate must be one of {DECODE_ESTIMATES}")
        self.calibrate = calibrate
        self.decode_estimate = decode_estimate
        self.workers: dict[str, WorkerRates] = {}
        self._outputs: deque[tuple[int, int]] = deque(maxlen=RATIO_WINDOW)  # (realized, asked)
        # Bumped whenever what adjust() returns may change: cached views key on it.
        self.version = 0

    # ------------------------------------------------------------ events
    def register(self, worker_id: str, prefill_tok_s: float, decode_tok_s: list[float]) -> None:
        """A worker (re)joined: start from its advertised rates."""
        self.version += 1
        self.workers[worker_id] = WorkerRates(prefill_tok_s, tuple(decode_tok_s))

    def forget(self, worker_id: str) -> None:
        self.version += 1
        self.workers.pop(worker_id, None)

    def on_heartbeat(self, worker_id: str, n_active: int, now: float | None = None) -> None:
        w = self.workers.get(worker_id)
        if w is None or not self.calibrate:
            return
        now = time.monotonic() if now is None else now
        w.active.append((now, n_active))
        while w.active and w.active[0][0] < now - HISTORY_S:
            w.active.popleft()

    def on_done(
        self,
        worker_id: str,
        stats: dict[str, Any],
        finish_reason: str,
        max_tokens: int,
        t_first: float,
        now: float | None = None,
    ) -> None:
        """A request finished on ``worker_id``; ``t_first``/``now`` on the router clock."""
        now = time.monotonic() if now is None else now
        self.version += 1
        output = int(stats.get("output_tokens", 0) or 0)
        if max_tokens > 0 and finish_reason in ("eos", "stop", "length"):
            self._outputs.append((output, max_tokens))
        w = self.workers.get(worker_id)
        if w is None or not self.calibrate:
            return
        prefill_s = float(stats.get("prefill_s", 0.0) or 0.0)
        computed = int(stats.get("prompt_tokens", 0) or 0) - int(stats.get("cached_tokens", 0) or 0)
        prefill_end = t_first or now
        alone = w.mean_active(prefill_end - prefill_s, prefill_end)
        if (
            computed >= MIN_PREFILL_TOKENS
            and prefill_s > 0
            and alone is not None
            and alone <= ALONE
        ):
            w.prefill_factor = _ewma(w.prefill_factor, computed / prefill_s / w.prefill_tok_s)
        self._decode_sample(w, output, float(stats.get("decode_s", 0.0) or 0.0), now)

    def on_progress(
        self, worker_id: str, tokens_seen: int, t_first: float, now: float | None = None
    ) -> None:
        """A request still running on ``worker_id`` has relayed ``tokens_seen`` tokens,
        the first at ``t_first`` (router clock): a decode sample taken mid-flight, so
        that a burst is priced by what the workers deliver during it, not only by the
        requests that already finished (the router calls this at PROGRESS_FIRST tokens,
        then every PROGRESS_EVERY)."""
        w = self.workers.get(worker_id)
        if w is None or not self.calibrate or not t_first:
            return
        now = time.monotonic() if now is None else now
        self.version += 1
        self._decode_sample(w, tokens_seen, now - t_first, now)

    def _decode_sample(self, w: WorkerRates, output: int, decode_s: float, now: float) -> None:
        """``output`` tokens, the last ``output - 1`` decoded in ``decode_s`` up to ``now``."""
        batch = w.mean_active(now - decode_s, now) if decode_s > 0 else None
        if output >= MIN_OUTPUT_TOKENS and batch is not None:
            batch = max(1.0, batch)  # it was decoding itself: at least one row
            measured = batch * (output - 1) / decode_s
            b = min(len(w.decode_tok_s), round(batch))
            factor = measured / _interpolate(w.decode_tok_s, batch)
            w.decode_factor[b] = _ewma(w.decode_factor.get(b), factor)

    # ------------------------------------------------------------ what the policy sees
    @property
    def ratio(self) -> float:
        """Realized / requested output tokens over recent requests (1.0 until known)."""
        if self.decode_estimate != "ratio" or len(self._outputs) < RATIO_MIN_SAMPLES:
            return 1.0
        realized = sum(o for o, _ in self._outputs)
        asked = sum(a for _, a in self._outputs)
        return min(1.0, max(RATIO_FLOOR, realized / asked))

    def route_request(self, prompt_tokens: int, max_tokens: int) -> RouteRequest:
        """The request as the policy should price it."""
        return RouteRequest(prompt_tokens, self._scale(max_tokens))

    def adjust(self, view: WorkerView) -> WorkerView:
        """``view`` with calibrated rates and estimated decode budgets, as enabled."""
        w = self.workers.get(view.id)
        if self.calibrate and w is not None:
            view = dataclasses.replace(view, prefill_rate=w.prefill(), decode_rates=w.decode())
        if self.ratio != 1.0:
            view = dataclasses.replace(
                view,
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

    def describe(self, worker_id: str) -> dict[str, Any]:
        """Extra fields of a worker's status row: its calibrated rates, when enabled."""
        w = self.workers.get(worker_id)
        if not self.calibrate or w is None:
            return {}
        return {
            "calibrated_prefill_tok_s": round(w.prefill(), 2),
            "calibrated_decode_tok_s": [round(x, 2) for x in w.decode()],
        }
