"""Times the engine's steps and decides when the step-time model rides a heartbeat.

A step's time is its *period*: from its start to the next step's start while the
engine stays busy, so the host work between steps (emitting tokens, building
heartbeats) is priced as serving pays it; the last step before the engine idles
ends when its own work ends. Samples go to ``common.steptime.StepStats``.

The model rides a heartbeat at once with a batch size the router has not seen,
or when an estimate the router holds has moved by ``MOVED`` or more (a device
that slowed down mid-burst: checked at most every ``MOVE_CHECK_S``); otherwise
when it changed, at most every ``every_s``. In the twin, a GPU that slows 1.5x
a second into a 48-burst was priced by its old speed until the burst's last
decisions with the once-a-second cadence alone (docs/results/twin/README.md).

With a trace file (``trace_to``; ``TANDEM_STEP_TRACE_DIR`` for a worker process),
every recorded step is also written out as it is recorded — its start on the
engine's clock, batch, context, prefill tokens, seconds, and the per-request
seconds left out of it — up to ``TRACE_MAX_STEPS`` lines: what a window's median
hides (a GPU's 16-row steps once priced at 2.1 ms where its rows waited 14 ms,
docs/results/h200/matrix-warm7/) is there step by step.

Work that belongs to one request, not to a step — admitting it (restoring its
cached prefix into the batch) and finishing it (storing its KV in the prefix
cache) — is timed apart (``per_request``) and left out of the step it fell in.
Otherwise it lands on whichever decode steps run while requests come and go: on
the H200 a burst's ramp and tail put it on batch 1-4 steps, which were then priced
up to 2x slower in serving than the warm-up measured them (docs/results/h200/).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from tandem.common import protocol as p
from tandem.common.steptime import StepModel, StepStats

log = logging.getLogger(__name__)

MOVED = 0.2  # an estimate this far (relative) from the one the router holds is news
MOVE_CHECK_S = 0.25  # the moved check runs at most this often (it reads every window)
TRACE_MAX_STEPS = 1_000_000  # a trace stops there (~40 MB)
MODEL_REFRESH_S = 0.5  # a chunk budget follows the step model this often
TRACE_HEADER = "start_s,batch,context_tokens,prefill_tokens,seconds,excluded_s\n"


class StepTimer:
    """Step periods in, step-time model reports out (see the module docstring)."""

    def __init__(
        self, every_s: float, resend_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stats = StepStats()
        self.every_s = every_s  # a changed model goes out at most this often
        self.resend_s = resend_s  # an unchanged one anyway this often
        self.clock = clock  # the engine's: a twin's virtual clock times virtual steps
        self._open: tuple[float, tuple[int, int, int]] | None = None
        self._excluded = 0.0  # per-request seconds inside the open step
        self.request_s = 0.0  # per-request seconds ever timed apart (admit + finish)
        self._sent: tuple[int, int, float] | None = None  # (version, sizes, clock time)
        self._sent_steps: dict[int, float] = {}  # batch -> raw step estimate the router holds
        self._checked_at = -1e300  # when the moved check last ran
        self._trace: TextIO | None = None
        self._traced = 0
        self._model = StepModel()  # as the chunk budget last read the stats
        self._model_at = -1e300
        self._model_version = -1  # stats.version the model was built at
        self._caps: dict[int, int] = {}  # decode batch -> prompt tokens a step may add

    # ------------------------------------------------------------ timing
    def start(self, batch: int, context_tokens: int, prefill_tokens: int) -> None:
        """A step begins: the previous one (if still open) ends here."""
        now = self.clock()
        self.stop(now)
        self._open = (now, (batch, context_tokens, prefill_tokens))

    def stop(self, t_end: float | None = None) -> None:
        """The open step ends (at ``t_end``, default now): record it."""
        if self._open is not None:
            t0, (batch, context, prefill) = self._open
            end = self.clock() if t_end is None else t_end
            seconds = end - t0 - self._excluded
            self.stats.record(batch, context, prefill, seconds)
            self._open = None
            if self._trace is not None:
                self._write_trace(t0, batch, context, prefill, seconds)
        self._excluded = 0.0

    def trace_to(self, path: str | Path) -> None:
        """Write every step recorded from now on to ``path`` (CSV, line-buffered: a
        worker ends without flushing its files)."""
        self.close_trace()
        self._trace = open(path, "w", buffering=1)  # noqa: SIM115 (held until close_trace)
        self._trace.write(TRACE_HEADER)
        self._traced = 0

    def close_trace(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    def _write_trace(self, t0: float, batch: int, context: int, prefill: int, s: float) -> None:
        assert self._trace is not None
        if self._traced >= TRACE_MAX_STEPS:
            self.close_trace()
            return
        self._traced += 1
        try:
            self._trace.write(
                f"{t0:.6f},{batch},{context},{prefill},{s:.7f},{self._excluded:.7f}\n"
            )
        except OSError as exc:  # a full disk ends the trace, never the serving
            log.warning("step trace stopped: %s", exc)
            self._trace = None

    def discard(self) -> None:
        """The open step failed: it measures nothing."""
        self._open = None
        self._excluded = 0.0

    @contextmanager
    def per_request(self) -> Iterator[None]:
        """Time the block apart: one request's own work, not the open step's."""
        t0 = self.clock()
        try:
            yield
        finally:
            took = max(0.0, self.clock() - t0)
            self.request_s += took
            if self._open is not None:
                self._excluded += took

    def adopt(self, stats: StepStats) -> None:
        """Start from steps measured elsewhere in this process (the warm-up's)."""
        self.stats = stats
        self._model_at = -1e300
        self._sent = None
        self._sent_steps = {}

    def chunk_cap(self, batch: int, factor: float, cap: int, floor: int) -> int:
        """``StepModel.prefill_budget`` of the steps measured so far, the model rebuilt
        at most every ``MODEL_REFRESH_S`` (building it reads every window), and after
        every new sample while it still lacks decode or prefill rates."""
        now = self.clock()
        m = self._model
        unknown = not (m.decode_batch and m.prefill_chunk)  # its budget is the token budget
        if now - self._model_at >= MODEL_REFRESH_S or (
            unknown and self.stats.version != self._model_version
        ):
            self._model, self._model_at = self.stats.model(), now
            self._model_version = self.stats.version
            self._caps.clear()
        tokens = self._caps.get(batch)
        if tokens is None:
            tokens = self._caps[batch] = self._model.prefill_budget(batch, factor, cap, floor)
        return tokens

    # ------------------------------------------------------------ reporting
    def forget_sent(self) -> None:
        """The router may know nothing (a resync): the next report is due at once."""
        self._sent = None

    def has_news(self) -> bool:
        """A batch size (or chunk bucket) the router has not seen yet."""
        sent = self._sent[1] if self._sent is not None else 0
        return self.stats.sizes != sent

    def _moved(self, now: float) -> bool:
        """Whether an estimate the router holds is ``MOVED`` off (at most every
        ``MOVE_CHECK_S``)."""
        if now - self._checked_at < MOVE_CHECK_S:
            return False
        self._checked_at = now
        sent, now_steps = self._sent_steps, self.stats.decode_estimates()
        return any(abs(est / sent[b] - 1) >= MOVED for b, est in now_steps.items() if b in sent)

    def report(self) -> p.StepReport | None:
        """The model's wire form when due: at once with a new batch size or a moved
        estimate, else when it changed (at most every ``every_s``), and every
        ``resend_s`` anyway."""
        now, version = self.clock(), self.stats.version
        if version == 0:
            return None
        if self._sent is not None and not self.has_news():
            sent_version, _, sent_at = self._sent
            changed = version != sent_version and (
                now - sent_at >= self.every_s or self._moved(now)
            )
            if not changed and now - sent_at < self.resend_s:
                return None
        self._sent = (version, self.stats.sizes, now)
        self._sent_steps = self.stats.decode_estimates()
        return self.stats.model().to_wire()
