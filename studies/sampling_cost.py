"""What the sampling fields cost a llama.cpp worker per sampled token (issue 31).

Times ``llama_sampling.sample`` (the chain, the logprobs, the grammar; not the model
step) for 4 requests decoding together on the embedded model, per setting, the
settings interleaved round by round so a busy machine weighs on all alike. The
json_schema row is also run with the grammar masking all 49k candidates at every
step ("mask-first", what a grammar inside the chain does) to show what the
check-then-mask order (llama.cpp's common sampler's) saves.

    python studies/sampling_cost.py [--rounds 3] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from tandem.common.model_files import default_model_path
from tandem.common.protocol import SamplingParams
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.workers.backends import llama_sampling as ls
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "temperature 0.8": {"temperature": 0.8, "seed": 1},
    "penalties (all three)": {
        "presence_penalty": 1.0,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.2,
    },  # fmt: skip
    "logit_bias (10 ids)": {"logit_bias": {i: 1.0 for i in range(100, 110)}},
    "min_p 0.1 (t 0.8)": {"temperature": 0.8, "seed": 1, "min_p": 0.1},
    "logprobs 5": {"logprobs": 5},
    "json_schema": {"json_schema": SCHEMA},
    "json_schema, mask-first": {"json_schema": SCHEMA},
}


def _mask_first(c: ls.Chain, ctx: Any, index: int, n_vocab: int) -> int:
    import llama_cpp as L
    import numpy as np

    raw = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, index), (n_vocab,))
    token = ls._pick(c.chain, raw, first=c.grammar)
    L.llama_sampler_accept(c.grammar, token)
    L.llama_sampler_accept(c.chain, token)
    return token


def one_round(backend: Any, prompts: list[list[int]], name: str, tokens: int) -> list[float]:
    """Seconds per ``sample`` call for one setting, 4 requests decoding together."""
    spent: list[float] = []
    inner: Callable[..., int] = ls.sample

    def timed(req: Request, ctx: Any, index: int, n_vocab: int) -> int:
        t0 = time.perf_counter()
        out = inner(req, ctx, index, n_vocab)
        spent.append(time.perf_counter() - t0)
        return out

    constrained = ls._sample_constrained
    ls.sample = timed  # llama.py calls it through the module
    if name.endswith("mask-first"):
        ls._sample_constrained = _mask_first
    try:
        cfg = EngineConfig(max_active=4, step_tokens=128, cache_tokens=0)  # seqs freed at the end
        engine = Engine(backend, cfg, lambda m: None, "b")
        for i, prompt in enumerate(prompts):
            sampling = SamplingParams(max_tokens=tokens, **SETTINGS[name])
            engine.submit(Request(f"{name}-{i}", prompt, sampling))
        while engine.queue or engine.active:
            engine.step()
    finally:
        ls.sample, ls._sample_constrained = inner, constrained
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    from tandem.workers.backends.llama import LlamaBackend

    path = default_model_path()
    backend = LlamaBackend(path, n_ctx=2048, threads=2, max_active=4, cache_entries=4,
                           step_tokens=128)  # fmt: skip
    tok = TextTokenizer(tokenizer_spec_from_gguf(path))
    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    asks = ["Describe a cat as JSON.", "Name a dog.", "Write a haiku.", "Count to five."]
    prompts = [tok.encode(chat.format(a)) for a in asks]
    per: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name in SETTINGS:
            per[name] += one_round(backend, prompts, name, args.tokens)
    base = statistics.median(per["greedy"])
    print(f"{'setting':26} {'calls':>6} {'median us':>10} {'p90 us':>8} {'x greedy':>9}")
    for name, xs in per.items():
        xs.sort()
        med, p90 = statistics.median(xs), xs[int(0.9 * (len(xs) - 1))]
        print(f"{name:26} {len(xs):6d} {med * 1e6:10.0f} {p90 * 1e6:8.0f} {med / base:9.1f}")


if __name__ == "__main__":
    main()
