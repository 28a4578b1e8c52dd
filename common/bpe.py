"""Byte-level BPE vocabularies from GGUF (`tokenizer.ggml.model == "gpt2"`) as HF JSON.

The merges come with the file; what differs per family is how llama.cpp splits text
before merging (`tokenizer.ggml.pre`): GPT-2's regex, Llama 3's (digits in runs of
up to three, merges ignored for whole-word hits), Qwen2's (single digits), or
digits one by one first (SmolLM, StarCoder).
"""

from __future__ import annotations

import logging
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger(__name__)

# Pre-tokenizer names from `tokenizer.ggml.pre`, grouped by the regexes llama.cpp
# applies (llama-vocab.cpp, llm_tokenizer_bpe). Regexes are the HF originals.
_DIGITS_GPT2 = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
)
_GPT2 = frozenset({"gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de"})
LLAMA3_PRES = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe", "lfm2"}
)
_QWEN2 = frozenset({"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"})
_LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = _LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")


def _pre_tokenizer(pre: str) -> tuple[Any, bool]:
    """(HF pre-tokenizer, ignore_merges) matching llama.cpp's splitting for `pre`."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_GPT2:
        # llama.cpp splits every digit apart before the GPT-2 regex.
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level]), False
    if pre in LLAMA3_PRES or pre in _QWEN2:
        regex = _LLAMA3_RE if pre in LLAMA3_PRES else _QWEN2_RE
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        raw_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, raw_bytes]), pre in LLAMA3_PRES
    if pre not in _GPT2:
        log.warning("unknown GGUF pre-tokenizer %r: using GPT-2 ByteLevel; ids may differ", pre)
    return byte_level, False


def bpe_tokenizer(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    """An HF tokenizer for a GPT-2 style byte-level BPE vocabulary (no added tokens yet)."""
    vocab: dict[str, int] = {}
    for i, text in enumerate(tokens):
        # As llama.cpp's loader: empty texts get a placeholder, a duplicate's last id wins.
        vocab[text or f"[EMPTY_{i}]"] = i
    pairs = [(a, b) for a, _, b in (m.partition(" ") for m in merges or [])]
    pre_tok, ignore_merges = _pre_tokenizer(pre)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    return tok
