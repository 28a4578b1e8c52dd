"""SentencePiece vocabularies from GGUF (`tokenizer.ggml.model == "llama"`) as HF JSON.

llama.cpp's SPM tokenizer (llm_tokenizer_spm) starts from single UTF-8 characters
and repeatedly merges the adjacent pair whose concatenation is the vocabulary
token with the highest score (leftmost on ties); characters left outside the
vocabulary become their `<0xXX>` byte tokens. An HF BPE model reproduces that
when its merge list holds every pair (a, b) with a, b and a+b all in the
vocabulary, ranked by the score of a+b, and `byte_fallback` is on. Spaces are
`▁`; a `▁` is prefixed to every text run that starts the prompt or follows a
special token when the model adds a space prefix (Llama 2, Mistral, Phi-3; not
Gemma), which HF's per-segment normalizer does the same way.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers

SPACE = "\u2581"  # ▁, SentencePiece's visible space


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) pair whose concatenation is a token, best-scored first."""
    ids = {text: i for i, text in enumerate(tokens)}  # a duplicate's last id wins
    ranked: list[tuple[float, int, str, str]] = []
    for text, i in ids.items():
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def build_spm_tokenizer(
    tokens: list[str], scores: list[float], unk_id: int | None, add_space_prefix: bool
) -> Tokenizer:
    """An HF tokenizer that splits text as llama.cpp's SPM tokenizer does (no added tokens)."""
    vocab: dict[str, int] = {}
    for i, text in enumerate(tokens):
        vocab[text or f"[EMPTY_{i}]"] = i
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    bpe = models.BPE(
        vocab=vocab,
        merges=spm_merges(tokens, scores),
        unk_token=unk,
        byte_fallback=True,
        fuse_unk=True,
    )
    tok = Tokenizer(bpe)
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(decode)
    return tok
