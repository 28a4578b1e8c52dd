"""json_schema on the MLX worker: a token-level automaton from llguidance (the Rust
grammar engine behind llama.cpp's, vLLM's and SGLang's structured output).

Each constrained request has an ``LLMatcher`` over the model's own tokenizer. Before
a row samples, its matcher fills a bitmask of the tokens it allows (tens of
microseconds a step, a couple of ms the first); the row's disallowed logits go to
-inf; once the step's token is known on the host the matcher consumes it. A mask
needs the previous token, so a batch holding a constrained row does not queue its
next step ahead (backend.py). Logprobs are taken before the mask, as on llama.cpp.

llguidance is optional: without it the MLX worker does not advertise json_schema
and the router sends those requests to llama.cpp workers.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from tandem.common.tokenizer import TokenizerSpec

AVAILABLE = importlib.util.find_spec("llguidance") is not None


# JSON as json.dumps writes it: llguidance's default allows any run of whitespace
# between items, which lets a model fill its budget with blanks and never close the
# object (llama.cpp's converter bounds it too). A schema's "x-guidance" may override.
_JSON_STYLE: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@lru_cache(maxsize=64)
def _compiled(schema: str) -> str:
    import llguidance

    return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_STYLE))


class Grammars:
    """Matchers for one model's tokenizer (built on first use: ~0.3 s for 49k tokens)."""

    def __init__(self, spec: TokenizerSpec, vocab_size: int) -> None:
        self.spec = spec
        self.vocab_size = vocab_size
        self._tokenizer: Any = None

    def _tok(self) -> Any:
        if self._tokenizer is None:
            import llguidance

            self._tokenizer = llguidance.LLTokenizer(
                self.spec.tokenizer_json, n_vocab=self.vocab_size, eos_token=list(self.spec.eos_ids)
            )
        return self._tokenizer

    def matcher(self, schema: str, sent: list[int]) -> Any:
        """A matcher for ``schema`` that has consumed ``sent`` (a migrated stream's
        output); ValueError naming what is wrong."""
        import llguidance

        try:
            grammar = _compiled(schema)
        except Exception as exc:  # the compiler raises on what it cannot take
            raise ValueError(f"json_schema cannot be used: {exc}") from exc
        m = llguidance.LLMatcher(self._tok(), grammar, log_level=0)
        if sent and not m.consume_tokens(sent):
            raise ValueError("the resumed output does not match the json_schema")
        if m.is_error():
            raise ValueError(f"json_schema cannot be used: {m.get_error()}")
        return m

    def problem(self, schema: str, sent: list[int]) -> str | None:
        try:
            self.matcher(schema, sent)
        except ValueError as exc:
            return str(exc)
        return None


def allowed(matchers: list[Any], vocab_size: int) -> mx.array:
    """(len(matchers), vocab) booleans: the tokens each matcher allows next."""
    words = -(-vocab_size // 32)
    bits = np.zeros((len(matchers), words), dtype=np.int32)
    for row, m in zip(bits, matchers, strict=True):
        m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
    # Token 32 w + k is bit k of word w: little-endian words, bits least first.
    ok = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size] > 0
    ok[~ok.any(axis=1)] = True  # a matcher in an error state: unconstrained, never all -inf
    return mx.array(ok)


def constrain(x: mx.array, rows: list[tuple[int, Any]]) -> mx.array:
    """``x`` with each listed row's disallowed tokens at -inf (rows: (index, matcher))."""
    idx = mx.array([i for i, _ in rows])
    ok = allowed([m for _, m in rows], x.shape[-1])
    x = x.astype(mx.float32)
    x[idx] = mx.where(ok, x[idx], -mx.inf)
    return x


def consume(matcher: Any, token: int) -> None:
    """Advance ``matcher`` by the token its row produced (a masked row only produces
    allowed tokens; an error state would only leave the rest unconstrained)."""
    matcher.consume_token(token)
