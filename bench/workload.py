"""Workloads: when requests arrive, and which prompt each one sends.

Three arrival shapes, each with a cache-hit mix (the fraction of requests whose
prompt starts with the prefix seeded into every worker):

- ``burst``: ``requests`` arrivals ``spacing_s`` apart (the article's protocol);
- ``poisson``: exponential gaps at ``rate_rps`` for ``duration_s``;
- ``onoff``: ``bursts`` bursts of ``requests`` arrivals ``spacing_s`` apart,
  separated by ``gap_s`` of silence (spiky traffic);
- ``trace``: a recorded trace (Mooncake JSONL, bench/trace.py): its arrival
  times, prompt and output lengths and shared prefix blocks, scaled down. No
  prefix is seeded: sharing comes from the trace itself.

Prompts are token ids, not text, so their lengths are exact: a hit is the
prefix plus a short tail, a miss a prompt of the same length that shares no
block with the prefix or with any other miss (its first tokens differ).
Arrival times and the hit pattern depend only on (workload, seed), so every
policy sees the same requests in run r.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tandem.bench.trace import TraceRequest, TraceScale, load_trace, trace_prompt

KINDS = ("burst", "poisson", "onoff", "trace")


@dataclass(frozen=True)
class Arrival:
    """One request of a workload: its offset from the first arrival and its prompt kind."""

    index: int
    offset_s: float
    hit: bool
    output_tokens: int = 128
    trace: TraceRequest | None = None  # a trace workload's request (its prompt's blocks)


@dataclass(frozen=True, kw_only=True)
class Workload:
    kind: str = "burst"
    requests: int = 8  # burst: total; onoff: per burst
    spacing_s: float = 0.05
    rate_rps: float = 1.0  # poisson
    duration_s: float = 30.0  # poisson
    bursts: int = 3  # onoff
    gap_s: float = 10.0  # onoff: idle time between bursts
    hit_fraction: float = 1.0
    prefix_tokens: int = 512
    prompt_tokens: int = 516
    output_tokens: int = 128
    same_prompt: bool = False  # every hit sends the identical prompt (the seed protocol)
    trace: str = ""  # trace: the JSONL file
    trace_scale: TraceScale = TraceScale()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"workload kind must be one of {KINDS}, not {self.kind!r}")
        if self.requests < 1 or self.bursts < 1 or self.output_tokens < 1:
            raise ValueError("requests, bursts and output_tokens must be >= 1")
        if self.spacing_s < 0 or self.gap_s < 0:
            raise ValueError("spacing_s and gap_s must be >= 0")
        if self.rate_rps <= 0 or self.duration_s <= 0:
            raise ValueError("rate_rps and duration_s must be > 0")
        if not 0.0 <= self.hit_fraction <= 1.0:
            raise ValueError("hit_fraction must be in [0, 1]")
        if not 1 <= self.prefix_tokens < self.prompt_tokens:
            raise ValueError("need 1 <= prefix_tokens < prompt_tokens (a hit adds a tail)")
        if (self.kind == "trace") != bool(self.trace):
            raise ValueError("a trace file goes with --workload trace, and only with it")

    @property
    def seeds_prefix(self) -> bool:
        """Whether runs start with the prefix seeded into every worker (not for traces)."""
        return self.kind != "trace"

    def max_request_tokens(self) -> int:
        """The longest prompt + output of any request (sizes each worker's KV cells)."""
        if self.kind != "trace":
            return self.prompt_tokens + self.output_tokens
        return max(r.prompt_tokens + r.output_tokens for r in self._trace())

    def _trace(self) -> tuple[TraceRequest, ...]:
        return load_trace(self.trace, self.trace_scale)

    @property
    def label(self) -> str:
        """A short human name, also used in file names."""
        if self.kind == "trace":
            sc = self.trace_scale
            limit = f"-n{sc.limit}" if sc.limit else ""
            return (
                f"trace-{Path(self.trace).stem}-len{sc.length_scale:g}x-out{sc.output_scale:g}x"
                f"-time{sc.time_scale:g}x{limit}"
            )
        if self.kind == "burst":
            shape = f"burst{self.requests}"
        elif self.kind == "poisson":
            shape = f"poisson{self.rate_rps:g}rps-{self.duration_s:g}s"
        else:
            shape = f"onoff{self.bursts}x{self.requests}-gap{self.gap_s:g}s"
        return f"{shape}-hit{round(100 * self.hit_fraction)}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Workload:
        return cls(**{**doc, "trace_scale": TraceScale(**doc.get("trace_scale", {}))})

    def arrivals(self, seed: int) -> list[Arrival]:
        """The schedule for one run; deterministic in (self, seed)."""
        if self.kind == "trace":
            return [
                Arrival(i, r.offset_s, False, r.output_tokens, r)
                for i, r in enumerate(self._trace())
            ]
        rng = random.Random(f"{self.label}/{seed}")
        offsets = self._offsets(rng)
        n_hit = round(self.hit_fraction * len(offsets))
        hits = set(rng.sample(range(len(offsets)), n_hit))
        return [Arrival(i, t, i in hits, self.output_tokens) for i, t in enumerate(offsets)]

    def _offsets(self, rng: random.Random) -> list[float]:
        if self.kind == "burst":
            return [i * self.spacing_s for i in range(self.requests)]
        if self.kind == "onoff":
            span = (self.requests - 1) * self.spacing_s + self.gap_s
            return [
                b * span + i * self.spacing_s
                for b in range(self.bursts)
                for i in range(self.requests)
            ]
        out, t = [0.0], rng.expovariate(self.rate_rps)
        while t < self.duration_s:
            out.append(t)
            t += rng.expovariate(self.rate_rps)
        return out


class PromptBook:
    """Token-id prompts for a workload, cut from text the model's tokenizer encoded.

    Real text (not random ids) so that real backends generate ordinary output.
    """

    def __init__(self, encode: Any, workload: Workload) -> None:
        self.w = workload
        self.prefix = _exactly(encode, _PREFIX_TEXT, workload.prefix_tokens)
        self._encode = encode

    def prompt(self, a: Arrival) -> list[int]:
        """The prompt of arrival ``a`` (a hit: prefix + tail; a miss: unrelated text;
        a trace request: its scaled blocks)."""
        if a.trace is not None:
            return trace_prompt(a.trace, self.w.trace_scale, a.index)
        n_tail = self.w.prompt_tokens - self.w.prefix_tokens
        tag = 0 if self.w.same_prompt else a.index
        if a.hit:
            # Reversed digits then a dot: a prefix-free tag, so even a few-token tail differs.
            tail = _exactly(self._encode, f"{str(tag)[::-1]}. {_TAIL_TEXT}", n_tail)
            return self.prefix + tail
        # A distinct first block per miss: no miss shares cache blocks with another.
        head = f"Ticket {a.index} (batch {a.index * 7919 % 1000}): "
        return _exactly(self._encode, head + _MISS_TEXT, self.w.prompt_tokens)


def _exactly(encode: Any, text: str, n: int) -> list[int]:
    """The first ``n`` token ids of ``text`` repeated as often as needed."""
    ids: list[int] = []
    chunk = list(encode(text))
    if not chunk:
        raise ValueError("the tokenizer encoded the bench text to nothing")
    while len(ids) < n:
        ids += chunk
    return ids[:n]


_PREFIX_TEXT = " ".join(
    f"Log line {i}: station {i % 11} measured {i * 37 % 101} units of rain and "
    f"{i * 13 % 29} knots of wind; the operator noted nothing unusual."
    for i in range(200)
)
_TAIL_TEXT = "which station was the wettest, and by how much?"
_MISS_TEXT = " ".join(
    f"Item {i} of the inventory is a {('red', 'green', 'blue')[i % 3]} box holding "
    f"{i * 17 % 53} screws, stored on shelf {i % 9}."
    for i in range(200)
)
