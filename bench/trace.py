"""Request traces in Mooncake's JSONL format, scaled to fit a small model and a short run.

One JSON object per line: ``timestamp`` (ms from the trace's start),
``input_length`` and ``output_length`` (tokens) and ``hash_ids``: one id per
512-token block of the prompt; equal ids at the same position are the same
block, and since ids are chained an id stands for the whole prefix up to it.

Scaling keeps that sharing structure: each hash id becomes one deterministic
run of ``512 / length_scale`` token ids (the same id gives the same tokens
wherever it appears), the prompt is the concatenation of its blocks cut to
``input_length / length_scale`` tokens, so two requests share exactly the
scaled blocks the trace says they share. Outputs scale by ``output_scale``
(1: as traced). Arrival times are divided by ``time_scale`` (2: twice as
fast). ``limit`` keeps the first N requests.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

TRACE_BLOCK_TOKENS = 512  # what one hash id stands for in the trace
_IDS = range(1000, 40000)  # ordinary tokens of the embedded vocabulary


@dataclass(frozen=True)
class TraceRequest:
    offset_s: float  # from the first request of the trace
    prompt_tokens: int  # after scaling, >= 1
    output_tokens: int  # after scaling, >= 1
    blocks: tuple[int, ...]  # the trace's hash ids


@dataclass(frozen=True)
class TraceScale:
    length_scale: float = 16.0  # prompt tokens (and block size) divided by this
    output_scale: float = 1.0
    time_scale: float = 1.0  # arrival times divided by this
    limit: int = 0  # first N requests (0: all)

    def __post_init__(self) -> None:
        if not (self.length_scale >= 1 and self.output_scale >= 1 and self.time_scale > 0):
            raise ValueError("length_scale and output_scale must be >= 1, time_scale > 0")
        if self.limit < 0:
            raise ValueError("limit must be >= 0")

    @property
    def block_tokens(self) -> int:
        return max(1, round(TRACE_BLOCK_TOKENS / self.length_scale))


@functools.lru_cache(maxsize=8)
def load_trace(path: str, scale: TraceScale) -> tuple[TraceRequest, ...]:
    """The trace at ``path``, scaled; ValueError names the first bad line."""
    out: list[TraceRequest] = []
    t0: float | None = None
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ts, n_in, n_out = (
                float(row["timestamp"]),
                int(row["input_length"]),
                int(row["output_length"]),
            )
            blocks = tuple(int(h) for h in row["hash_ids"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"trace {path} line {n}: {exc!r}") from None
        t0 = ts if t0 is None else t0
        out.append(
            TraceRequest(
                max(0.0, (ts - t0) / 1000 / scale.time_scale),
                max(1, round(n_in / scale.length_scale)),
                max(1, round(n_out / scale.output_scale)),
                blocks,
            )
        )
        if scale.limit and len(out) >= scale.limit:
            break
    if not out:
        raise ValueError(f"trace {path} holds no requests")
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def block_tokens(hash_id: int, n: int) -> tuple[int, ...]:
    """The ``n`` token ids hash id ``hash_id`` stands for (deterministic)."""
    return tuple(random.Random(hash_id * 1_000_003 + n).choices(_IDS, k=n))


def trace_prompt(req: TraceRequest, scale: TraceScale, index: int) -> list[int]:
    """The scaled prompt of one trace request: its blocks, cut to its length. A prompt
    longer than its blocks (the trace's last block is partial) is padded with tokens
    unique to the request, so the padding is never shared."""
    size = scale.block_tokens
    ids: list[int] = []
    for h in req.blocks:
        if len(ids) >= req.prompt_tokens:
            break
        ids += block_tokens(h, size)
    if len(ids) < req.prompt_tokens:
        ids += block_tokens(-1 - index, req.prompt_tokens - len(ids))
    return ids[: req.prompt_tokens]
