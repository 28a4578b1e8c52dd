"""Which weights a CPU llama.cpp worker serves: the file as given, or the same weights
converted once to Q8_0, whichever serves faster on this machine.

Some quantizations have no batched CPU kernel on a given machine (on x86, Q4_1 has
neither a repacked layout nor a tiled matrix product), so a prompt costs as much per
token as a decode step does. Q8_0 has one: on the 2-core development machine the
embedded Q4_1 model prefilled 244 tok/s and its Q8_0 conversion 490, at the same
single-row decode (docs/results/peer.md). A 4- to 6-bit weight converted to Q8_0 is
all but lossless (Q8_0 steps by 1/127 of a block's largest weight, Q4_1 by 1/15 of
its range, so a weight moves by a small part of its own step; the embedded model's
NLL over 1,024 tokens: 3.6427 -> 3.6458, +0.09 %), unlike a conversion down to another
4-bit type (Q4_1 -> Q4_0: +6.8 %, top-1 agreement 68 %), which this module never makes.

``auto`` (the default) converts on a worker's first start, checks the conversion
scores a fixed text as the source does, times both on a reference request and keeps
the faster; the choice and the file are cached (``$TANDEM_CACHE_DIR/weights``) per
source digest, thread count, CPU and llama.cpp build, so later starts pay nothing.
A GPU worker serves the file as given: its kernels batch every type.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp as L
import numpy as np

from tandem.common.affinity import cpu_name
from tandem.common.gguf_file import read_gguf_header, weights_digest
from tandem.common.model_files import cache_root
from tandem.workers.backends.llama_params import Placement

log = logging.getLogger(__name__)

CHOICES = ("auto", "as-is", "q8_0")
Q8_0_FTYPE = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
# ggml types under 8 bits a weight (Q4_0 .. Q6_K): Q8_0 holds each of them nearly exactly.
CONVERTIBLE = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 10: "Q2_K", 11: "Q3_K",
               12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}  # fmt: skip
MAX_NLL_RISE = 0.01  # the conversion scores the text within 1 % of the source
MIN_GAIN = 0.9  # and serves the reference request in at most 0.9x the time
REF_PROMPT, REF_OUTPUT = 512, 128  # the reference request: a chat turn's shape
DECODE_STEPS = 8

# The fixed text both files score (written for this check; any natural prose works).
TEXT = (
    "The workshop at the end of the lane had been a bakery once, and on cold mornings the "
    "walls still smelled faintly of bread. Now it held lathes, a long bench scarred by "
    "decades of chisels, and shelves of jars sorted by a system only the owner understood. "
    "She arrived before sunrise, lit the stove, and spent the first hour sharpening tools "
    "while the kettle came to a boil. Customers brought her broken chairs, warped doors and "
    "clocks that had stopped at the moment somebody died. She fixed what could be fixed and "
    "told the truth about the rest, which was why people kept coming back. In the evenings "
    "she wrote down what each repair had taught her, in a notebook that was almost full."
)


@dataclass(frozen=True)
class Timing:
    prefill_tok_s: float
    decode_step_s: float
    nll: float

    def request_s(self) -> float:
        """Seconds for the reference request alone."""
        return REF_PROMPT / self.prefill_tok_s + REF_OUTPUT * self.decode_step_s


def dominant_type(path: Path) -> int:
    """The ggml type holding most of the file's matrix weights."""
    count: dict[int, int] = {}
    for t in read_gguf_header(path).tensors:
        if len(t.shape) >= 2:
            count[t.ggml_type] = count.get(t.ggml_type, 0) + math.prod(t.shape)
    return max(count, key=lambda k: count[k]) if count else -1


def served_weights(source: Path, choice: str, threads: int) -> tuple[Path, str]:
    """(the file to load, its format label: "" for the source as given, else "q8_0")."""
    if choice not in CHOICES:
        raise ValueError(f"weights must be one of {CHOICES}, not {choice!r}")
    if choice == "as-is" or dominant_type(source) not in CONVERTIBLE:
        if choice == "q8_0":
            log.info("%s is not a sub-8-bit quantization: served as given", source.name)
        return source, ""
    try:
        return _served(source, choice, threads)
    except (OSError, RuntimeError) as exc:
        if choice == "q8_0":  # asked for: say why not
            raise
        # auto: a read-only or full cache, a conversion llama.cpp refused: the file serves
        log.warning("weights: serving %s as given (%s)", source.name, exc)
        return source, ""


def _served(source: Path, choice: str, threads: int) -> tuple[Path, str]:
    folder = cache_root() / "weights"
    folder.mkdir(parents=True, exist_ok=True)
    digest = weights_digest(source)
    converted = folder / f"{digest}.q8_0.gguf"
    with open(folder / f"{digest}.lock", "w") as lock:  # one converter per machine
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not converted.is_file():
            _convert(source, converted, threads)
        if choice == "q8_0":
            return converted, "q8_0"
        keep = _cached_choice(folder / f"{digest}.t{threads}.json")
        if keep is None:
            keep = _measure_choice(source, converted, threads, folder / f"{digest}.t{threads}.json")
    return (converted, "q8_0") if keep else (source, "")


def machine() -> dict[str, str]:
    """What a cached choice holds for: the CPU and the llama.cpp build."""
    return {"cpu": cpu_name(), "machine": platform.machine(),
            "llama_cpp": str(getattr(L, "__version__", ""))}  # fmt: skip


def _cached_choice(path: Path) -> bool | None:
    try:
        doc = json.loads(path.read_text())
        if doc.get("machine") == machine():
            return bool(doc["converted"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _convert(source: Path, out: Path, threads: int) -> None:
    t0 = time.perf_counter()
    params = L.llama_model_quantize_default_params()
    params.ftype = Q8_0_FTYPE
    params.allow_requantize = True  # the source is itself quantized
    params.nthread = threads
    tmp = out.with_suffix(".tmp")
    if L.llama_model_quantize(str(source).encode(), str(tmp).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not convert {source} to Q8_0")
    tmp.replace(out)
    log.info("converted %s to Q8_0 in %.1f s", source.name, time.perf_counter() - t0)


def _measure_choice(source: Path, converted: Path, threads: int, record: Path) -> bool:
    """Time and score both files (interleaved, the better of two rounds) and record
    whether the conversion is kept."""
    rounds = [(_time(source, threads), _time(converted, threads)) for _ in range(2)]
    src = min((r[0] for r in rounds), key=Timing.request_s)
    conv = min((r[1] for r in rounds), key=Timing.request_s)
    close = abs(conv.nll - src.nll) <= MAX_NLL_RISE * src.nll
    faster = conv.request_s() <= MIN_GAIN * src.request_s()
    keep = close and faster
    doc = {"converted": keep, "machine": machine(), "threads": threads,
           "source": asdict(src), "q8_0": asdict(conv), "scores_alike": close,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    record.write_text(json.dumps(doc, indent=2))
    log.info(
        "weights: %s (reference request %.2f s as given, %.2f s as Q8_0; NLL %.4f / %.4f)",
        "Q8_0" if keep else "as given",
        src.request_s(),
        conv.request_s(),
        src.nll,
        conv.nll,
    )
    return keep


def _time(path: Path, threads: int) -> Timing:
    """Prefill rate and NLL over ``TEXT`` in one call, then single-row decode steps."""
    mparams, _devices = Placement(gpu=False).model_params()  # no GPU device at all
    model = L.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise ValueError(f"llama.cpp could not load {path}")
    try:
        return _time_model(model, threads)
    finally:
        L.llama_model_free(model)


def _time_model(model: object, threads: int) -> Timing:
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    text = TEXT.encode()
    buf = (L.llama_token * 1024)()
    n = L.llama_tokenize(vocab, text, len(text), buf, 1024, False, True)
    tokens = list(buf[: max(n, 0)])
    cparams = L.llama_context_default_params()
    cparams.n_ctx = 512
    cparams.n_batch = cparams.n_ubatch = 256
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.op_offload = False
    ctx = L.llama_init_from_model(model, cparams)
    batch = L.llama_batch_init(256, 0, 1)
    try:

        def decode(toks: list[int], start: int, logits: bool) -> float:
            for i, t in enumerate(toks):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, int(logits)
            batch.n_tokens = len(toks)
            t0 = time.perf_counter()
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed while timing the weights")
            return time.perf_counter() - t0

        prefill_s = decode(tokens, 0, True)
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), (len(tokens), n_vocab))
        top = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        nll = float(np.mean(lse[:-1] - logits[np.arange(len(tokens) - 1), tokens[1:]]))
        n = len(tokens)
        steps = [decode([tokens[i % n]], n + i, True) for i in range(DECODE_STEPS)]
        return Timing(len(tokens) / prefill_s, float(np.median(steps)), nll)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
