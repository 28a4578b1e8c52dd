"""The llama.cpp backend's per-request sampling: one sampler chain per request, the
history its stateful samplers are fed, and token logprobs.

The chain runs in llama.cpp's server order: logit_bias -> repetition penalty ->
presence/frequency penalties -> greedy, or top_k -> top_p -> min_p -> temperature ->
dist(seed). A grammar (json_schema) is kept beside the chain and used as llama.cpp's
own common sampler does: the chain picks a token; if the grammar allows it, it is
taken, else the grammar masks the candidates first and the chain picks again.
Greedy takes the likeliest allowed token either way; a draw from p, redrawn from p
restricted to the allowed set when refused, is p(t)/p(allowed), as masking first
(exactly so without top-k/top-p/min-p, whose first cut is of the unmasked set); and
it spares checking all 49k pieces against the grammar at most steps (docs/results/
sampling.md: 1.5 ms against 13 ms a token at the median).

Penalties follow OpenAI (and vLLM) where llama.cpp's server differs. llama.cpp counts
the last 64 tokens of prompt and output together for all three; here

- presence/frequency count every token *generated* for the request, and only those
  (OpenAI: "how often the token was sampled prior to the current position");
- repetition (an HF/vLLM extra) sees prompt and output, the whole context.

So they are two llama.cpp penalty samplers with their own histories: the repetition
one is fed the prompt when the request begins (``llama_sampler_accept``); the chain
feeds every sampled token to all of them (``llama_sampler_sample`` accepts it). The
grammar sees only output. A migrated stream's already-sent tokens (``resumed``) are
output: they are fed to the output samplers too, so a resumed JSON object continues.

Logprobs are the log-softmax of the row's logits after logit_bias and penalties and
before the grammar, temperature and truncation (docs/PROTOCOL.md). They are computed
by applying the chain's own bias and penalty samplers to a copy of the row's logits
before the chain samples, so they are llama.cpp's processing, not a re-implementation.
A request that did not ask pays nothing.
"""

from __future__ import annotations

import ctypes
import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import llama_cpp as L
import numpy as np
from llama_cpp.llama_grammar import json_schema_to_gbnf

from tandem.common.schema_keywords import unenforced
from tandem.workers.request import Request, TokenLogprobs

# What this backend serves (docs/PROTOCOL.md, Ready.capabilities).
CAPABILITIES: tuple[str, ...] = ("penalties", "logit_bias", "min_p", "logprobs", "json_schema")

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert _TOKEN_DATA.itemsize == ctypes.sizeof(L.llama_token_data)


@lru_cache(maxsize=64)
def schema_grammar(schema: str) -> str:
    """GBNF text for a JSON schema, by llama-cpp-python's converter (ValueError when
    it cannot convert it). Cached: clients send the same schema again and again."""
    try:
        return json_schema_to_gbnf(schema)
    except Exception as exc:  # the converter raises whatever its input trips
        raise ValueError(f"json_schema cannot be used: {exc}") from exc


def request_problem(req: Request, vocab: Any) -> str | None:
    """Why llama.cpp cannot constrain ``req``'s output to its json_schema, or None.
    Checked when the request arrives, so that building its chain cannot fail."""
    if req.sampling.json_schema is None:
        return None
    keyword = unenforced(json.loads(req.sampling.json_schema))  # valid JSON: the door checks
    if keyword:
        return f"json_schema: {keyword} is not enforced by llama.cpp's grammar; remove it"
    try:
        grammar = _grammar(req.sampling.json_schema, vocab)
    except ValueError as exc:
        return str(exc)
    try:
        for token in req.resumed_output():
            if not _allows(grammar, token):
                return "the resumed output does not match the json_schema"
            L.llama_sampler_accept(grammar, token)
    finally:
        L.llama_sampler_free(grammar)
    return None


def _grammar(schema: str, vocab: Any) -> Any:
    grammar = L.llama_sampler_init_grammar(vocab, schema_grammar(schema).encode(), b"root")
    if not grammar:
        raise ValueError("json_schema: llama.cpp could not parse the grammar made from it")
    return grammar


@dataclass
class Chain:
    """One request's sampler chain; ``chain`` owns every sampler listed beside it."""

    chain: Any
    logprobs: int | None  # None: not asked; n: the top n alternatives as well
    pre: list[Any] = field(default_factory=list)  # bias and penalties: what logprobs see
    repetition: Any = None  # fed the prompt
    output: list[Any] = field(default_factory=list)  # fed a resumed stream's sent tokens
    grammar: Any = None  # not in the chain (see the module's docstring); owned here


def build_chain(req: Request, vocab: Any, n_vocab: int, n_ctx: int) -> Chain:
    """The chain for ``req``, already fed its history (prompt, resumed output)."""
    s = req.sampling
    c = Chain(L.llama_sampler_chain_init(L.llama_sampler_chain_default_params()), s.logprobs)
    try:
        _add_processing(c, req, vocab, n_vocab, n_ctx)
        _add_selection(c, req)
        _feed_history(c, req)
    except Exception:
        free_chain(c)
        raise
    return c


def _add(c: Chain, sampler: Any) -> Any:
    if not sampler:
        raise ValueError("llama.cpp refused a sampler setting")
    L.llama_sampler_chain_add(c.chain, sampler)
    return sampler


def _add_processing(c: Chain, req: Request, vocab: Any, n_vocab: int, n_ctx: int) -> None:
    s = req.sampling
    if s.logit_bias:
        biases = (L.llama_logit_bias * len(s.logit_bias))()
        for i, (token, bias) in enumerate(s.logit_bias.items()):
            biases[i] = L.llama_logit_bias(token, bias)
        c.pre.append(_add(c, L.llama_sampler_init_logit_bias(n_vocab, len(biases), biases)))
    if s.repetition_penalty != 1.0:
        rep = L.llama_sampler_init_penalties(n_vocab, n_ctx, s.repetition_penalty, 0.0, 0.0)
        c.repetition = _add(c, rep)
        c.pre.append(c.repetition)
    if s.presence_penalty or s.frequency_penalty:
        # The window holds the whole output (a migrated stream's sent part included).
        window = max(1, min(n_ctx, s.max_tokens + req.resumed))
        pf = L.llama_sampler_init_penalties(
            n_vocab, window, 1.0, s.frequency_penalty, s.presence_penalty
        )
        c.pre.append(_add(c, pf))
        c.output.append(pf)
    if s.json_schema is not None:
        c.grammar = _grammar(s.json_schema, vocab)
        c.output.append(c.grammar)


def _add_selection(c: Chain, req: Request) -> None:
    s = req.sampling
    if s.temperature <= 0:
        _add(c, L.llama_sampler_init_greedy())
        return
    if s.top_k > 0:
        _add(c, L.llama_sampler_init_top_k(s.top_k))
    if s.top_p < 1.0:
        _add(c, L.llama_sampler_init_top_p(s.top_p, 1))
    if s.min_p > 0.0:
        _add(c, L.llama_sampler_init_min_p(s.min_p, 1))
    _add(c, L.llama_sampler_init_temp(s.temperature))
    _add(c, L.llama_sampler_init_dist(dist_seed(s.seed)))


def dist_seed(seed: int | None) -> int:
    """llama.cpp's 32-bit seed for ``seed`` (random when None). 0xFFFFFFFF means
    "pick one at random" to llama.cpp, so seeds are folded below it."""
    if seed is None:
        return random.getrandbits(32) % L.LLAMA_DEFAULT_SEED
    return seed % L.LLAMA_DEFAULT_SEED


def _feed_history(c: Chain, req: Request) -> None:
    if c.repetition is not None:
        for token in req.prompt:
            L.llama_sampler_accept(c.repetition, token)
    for sampler in c.output:
        for token in req.resumed_output():  # a grammar's are checked on arrival (request_problem)
            L.llama_sampler_accept(sampler, token)


def _allows(sampler: Any, token: int) -> bool:
    """Whether ``sampler`` leaves ``token`` possible (a grammar masks it to -inf)."""
    data = np.array([(token, 0.0, 0.0)], dtype=_TOKEN_DATA)
    arr = _token_array(data)
    L.llama_sampler_apply(sampler, ctypes.byref(arr))
    return bool(np.isfinite(data["logit"][0]))


def _token_array(data: np.ndarray) -> Any:
    ptr = data.ctypes.data_as(ctypes.POINTER(L.llama_token_data))
    return L.llama_token_data_array(ptr, len(data), -1, False)


def sample(req: Request, ctx: Any, index: int, n_vocab: int) -> int:
    """Sample ``req``'s next token from batch row ``index`` (the chain accepts it);
    sets ``req.token_logprobs`` when the request asked for them."""
    c: Chain = req.sampler
    processed = None if c.logprobs is None else processed_logits(c, ctx, index, n_vocab)
    if c.grammar is None:
        token = L.llama_sampler_sample(c.chain, ctx, index)
    else:
        token = _sample_constrained(c, ctx, index, n_vocab)
    if processed is not None:
        req.token_logprobs = token_logprobs(processed, token, c.logprobs or 0)
    return int(token)


def _sample_constrained(c: Chain, ctx: Any, index: int, n_vocab: int) -> int:
    """The chain's token if the grammar allows it, else the chain's pick among the
    tokens the grammar allows; accepted by grammar and chain."""
    raw = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, index), (n_vocab,))
    token = _pick(c.chain, raw)
    if not _allows(c.grammar, token):
        token = _pick(c.chain, raw, first=c.grammar)
        if not _allows(c.grammar, token):  # llama.cpp would abort the process on it
            raise RuntimeError("the json_schema grammar allows no token here")
    L.llama_sampler_accept(c.grammar, token)
    L.llama_sampler_accept(c.chain, token)
    return token


def _pick(chain: Any, logits: np.ndarray, first: Any = None) -> int:
    """The token ``chain`` selects from ``logits`` (after ``first``), not accepted."""
    data = np.empty(len(logits), dtype=_TOKEN_DATA)
    data["id"], data["logit"], data["p"] = np.arange(len(logits)), logits, 0.0
    arr = _token_array(data)
    if first is not None:
        L.llama_sampler_apply(first, ctypes.byref(arr))
    L.llama_sampler_apply(chain, ctypes.byref(arr))
    if not 0 <= arr.selected < arr.size:
        raise RuntimeError("the sampler chain selected no token")
    return int(arr.data[arr.selected].id)  # samplers may have moved the array


def processed_logits(c: Chain, ctx: Any, index: int, n_vocab: int) -> np.ndarray:
    """Row ``index``'s logits after the chain's bias and penalty samplers (a copy)."""
    raw = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, index), (n_vocab,))
    if not c.pre:
        return raw.copy()
    data = np.empty(n_vocab, dtype=_TOKEN_DATA)
    data["id"], data["logit"], data["p"] = np.arange(n_vocab), raw, 0.0
    arr = _token_array(data)
    for sampler in c.pre:  # apply does not change a sampler's state; accept does
        L.llama_sampler_apply(sampler, ctypes.byref(arr))
    if arr.size != n_vocab:
        raise RuntimeError("a bias or penalty sampler changed the candidate count")
    return data["logit"].copy()


def token_logprobs(logits: np.ndarray, token: int, n: int) -> TokenLogprobs:
    """``token``'s log-probability under ``logits`` and the ``n`` likeliest tokens'."""
    logprobs = log_softmax(logits)
    top = top_n(logprobs, n)
    return TokenLogprobs(float(logprobs[token]), top.tolist(), logprobs[top].tolist())


def top_n(x: np.ndarray, n: int, block: int = 64) -> np.ndarray:
    """Indices of ``x``'s ``n`` largest values, largest first (ties by index).

    A full argpartition of 49k values costs ~0.3-1 ms; here the maxima of 64-wide
    blocks give a bound (the n-th largest block maximum: at least n values reach it)
    and only the few values at or above it are sorted, ~0.05 ms.
    """
    n = min(n, len(x))
    if n == 0:
        return np.empty(0, dtype=np.int64)
    padded = np.pad(x, (0, -len(x) % block), constant_values=-np.inf)
    maxima = padded.reshape(-1, block).max(axis=1)
    bound = np.partition(maxima, len(maxima) - n)[len(maxima) - n] if n <= len(maxima) else -np.inf
    candidates = np.flatnonzero(x >= bound)
    order = np.lexsort((candidates, -x[candidates]))  # descending, ties by index
    return candidates[order[:n]]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities, float32 as llama-cpp-python computes them."""
    x = logits.astype(np.float32) - np.max(logits)
    with np.errstate(divide="ignore"):
        return x - np.log(np.sum(np.exp(x)))


def free_chain(c: Chain | None) -> None:
    if c is not None:
        L.llama_sampler_free(c.chain)
        if c.grammar:
            L.llama_sampler_free(c.grammar)
