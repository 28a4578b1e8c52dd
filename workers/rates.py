"""The rates a worker advertises in Ready, and where they come from.

In order of trust: what the worker measured at start (``workers.profiler.warm_up``),
where it measured; the rate flags or the stored profile (``tandem profile``) for
the shape between; a rough default when nothing else is known (and said so in
the log). A source that contradicts the measurement, or a profile with a stall in
it, is named in the log where the operator looks.
"""

from __future__ import annotations

import dataclasses
import logging

from tandem.common.pricing import padded, price
from tandem.common.ratefit import measured_drops
from tandem.common.steptime import StepModel
from tandem.workers.config import DEFAULT_DECODE_TOK_S, DEFAULT_PREFILL_TOK_S, WorkerConfig
from tandem.workers.engine import Backend
from tandem.workers.profiler import WarmUp
from tandem.workers.sanity import judge

log = logging.getLogger(__name__)

# How much a source of rates weighs against the warm-up's measurement, in measured
# steps (common.pricing): a profile a little (its shape between measured sizes), a
# guess nothing. A warm-up measures ~8-20 steps at each size it runs.
TOLD_WEIGHT, GUESS_WEIGHT = 1.0, 1e-3
DISAGREE = 1.25  # a source this far off the measurement (either way) is named in the log


def told_rates(cfg: WorkerConfig, backend: Backend) -> tuple[float, list[float], str] | None:
    """(prefill, decode by batch, where from) as flags or the stored profile say; None
    when nothing does."""
    from tandem.workers.profiles import stored_rates

    # A simulated device's profile file is its definition: advertise exactly that.
    stored = getattr(backend, "profile_rates", None) or stored_rates(backend)
    if cfg.decode_tok_s:
        prefill = cfg.prefill_tok_s or (stored[0] if stored else DEFAULT_PREFILL_TOK_S)
        return prefill, list(cfg.decode_tok_s), "the rate flags"
    if stored is None:
        return None
    return cfg.prefill_tok_s or stored[0], list(stored[1]), "the stored profile"


def rates(
    cfg: WorkerConfig, backend: Backend, warm: WarmUp | None = None
) -> tuple[float, list[float]]:
    """Rates advertised in Ready: what this worker measured at start (``warm``) where
    it measured, over the flags' or stored profile's shape, else a rough default."""
    told = told_rates(cfg, backend)
    if told is None and warm is None:
        log.warning(
            "no stored profile for %s on %s (%s) and no warm-up measurement: advertising "
            "rough default rates. Routing between unlike workers prices this one wrongly "
            "until live step times arrive; start it with --warmup on, or run `tandem "
            "profile --backend %s --device %s` here.",
            backend.name, backend.device, backend.model_name, backend.name, cfg.device,
        )  # fmt: skip
    prefill, decode, source = told or (DEFAULT_PREFILL_TOK_S, [DEFAULT_DECODE_TOK_S], None)
    decode = padded(decode, cfg.engine.max_active)  # a plateau past the last known size
    if source is not None:
        _warn_if_suspicious(decode, source)
    if warm is None:
        return prefill, decode
    gpu = backend.device.startswith("gpu")
    return measured_rates(prefill, decode, warm, source, cfg.engine.max_active, find_steps=gpu)


def measured_rates(
    prefill: float,
    decode: list[float],
    warm: WarmUp,
    source: str | None,
    max_active: int,
    find_steps: bool = False,
) -> tuple[float, list[float]]:
    """The warm-up's measurement folded into ``decode``/``prefill`` (from ``source``;
    None: a guess): measured batch sizes take the measured rate, the others the
    source's shape scaled to the measured points around them
    (``common.pricing.price``). A source that disagrees with the measurement by more
    than DISAGREE is named in the log. ``find_steps`` (a GPU): a step down the
    measurement shows is kept (``measured_steps``), not smoothed."""
    decode = padded(decode, max_active)
    model = judged(warm.stats.model())
    if model is None or (not model.decode_batch and not model.prefill_chunk):
        return prefill, decode
    guess = source is None
    weight = GUESS_WEIGHT if guess else TOLD_WEIGHT
    priced = price(prefill, decode, max_active, model, weight, find_steps=find_steps)
    out = list(priced.decode_tok_s)
    off = [
        f"batch {b}: {decode[b - 1]:.0f} -> {out[b - 1]:.0f} tok/s"
        for b in model.decode_batch
        if b <= len(decode) and not 1 / DISAGREE <= out[b - 1] / decode[b - 1] <= DISAGREE
    ]
    if off and not guess:
        log.warning(
            "%s disagrees with what this worker measured at start (context %d): %s. "
            "Advertising the measurement; re-run `tandem profile` on an idle machine.",
            source, warm.context, "; ".join(off),
        )  # fmt: skip
    log.info(
        "measured at start: prefill %.0f tok/s, decode %s tok/s by batch (from %s)",
        priced.prefill_tok_s, [round(x) for x in out], source or "a guess",
    )  # fmt: skip
    return priced.prefill_tok_s, out


def measured_steps(warm: WarmUp | None, max_active: int) -> tuple[int, ...]:
    """Batch sizes where the start-up measurement found the aggregate decode rate step
    down (``common.ratefit.measured_drops``), as ``measured_rates(find_steps=True)``
    kept them in the prices: the Ready names them, so the router's fit keeps them too.
    Asked of a GPU only: a CPU's quick measurement on a busy machine dips by chance."""
    model = judged(warm.stats.model()) if warm is not None else None
    if model is None or not model.decode_batch:
        return ()
    return tuple(b for b in measured_drops(model.decode_tok_s()) if b <= max_active)


def judged(model: StepModel) -> StepModel | None:
    """``model`` with its decode points judged (``workers.sanity``): repaired, or None
    when the measurement contradicts itself (then it is not used at all)."""
    if not model.decode_batch:
        return model
    rates = model.decode_tok_s()
    verdict = judge({b: r for b, (r, _) in rates.items()})
    if verdict.notes:
        log.warning("start-up measurement: %s", "; ".join(verdict.notes))
    if verdict.points is None:
        return None
    kept = sorted(verdict.points)
    return dataclasses.replace(
        model,
        decode_batch=tuple(kept),
        decode_step_s=tuple(b / verdict.points[b] for b in kept),
        decode_samples=tuple(rates[b][1] for b in kept),
    )


def _warn_if_suspicious(decode: list[float], source: str) -> None:
    """A stall caught in a profile (one bad point, or a dip with batch size) misprices
    the worker until live step times replace it: say so where the operator looks."""
    from tandem.common.ratefit import explain, fit_decode_rates

    problems = explain(decode, fit_decode_rates(decode))
    if problems:
        log.warning(
            "decode rates from %s look wrong: %s. The router repairs them and prices from "
            "live step times once requests run; re-run `tandem profile` on an idle machine.",
            source,
            "; ".join(problems),
        )
