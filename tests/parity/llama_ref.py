"""llama.cpp as the reference: its tokenizer, end-of-generation set, pieces and logits,
through the low-level API (one model per call, freed afterwards)."""

from __future__ import annotations

import ctypes
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from studies.models.llama_logits import llama_logits, mean_nll

__all__ = ["llama_logits", "mean_nll"]  # the references the parity tests share


@contextmanager
def llama_vocab(path: Path) -> Iterator[tuple[Any, Any]]:
    """(llama_cpp module, vocab) of `path`, loaded vocabulary-only."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load {path}"
    try:
        yield llama_cpp, llama_cpp.llama_model_get_vocab(model)
    finally:
        llama_cpp.llama_model_free(model)


def llama_tokenize(vocab: tuple[Any, Any], text: str, parse_special: bool) -> list[int]:
    """llama_tokenize without BOS/EOS (add_special false)."""
    llama_cpp, v = vocab
    data = text.encode("utf-8")
    n_max = 2 * len(data) + 8  # SPM may add a prefix space and byte tokens: room enough
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(v, data, len(data), buf, n_max, False, parse_special)
    assert n >= 0, f"llama_tokenize needed {-n} slots"
    return list(buf[:n])


def llama_eog_ids(vocab: tuple[Any, Any]) -> set[int]:
    llama_cpp, v = vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(v)
    return {i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(v, ctypes.c_int32(i))}


def llama_piece(vocab: tuple[Any, Any], token: int) -> bytes:
    """The bytes llama.cpp renders for `token` (special tokens as their text)."""
    llama_cpp, v = vocab
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(v, token, buf, len(buf), 0, True)
    assert n >= 0
    return buf.raw[:n]


def random_text(rng: random.Random) -> str:
    """Strings that stress pre-tokenization: digit runs, unicode, whitespace runs, contractions."""
    pieces = [
        lambda: "".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", k=8)),
        lambda: "".join(rng.choices("0123456789", k=rng.randint(1, 12))),
        lambda: rng.choice([" ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "\r\n", "\u3000"]),
        lambda: rng.choice(["'s", "'t", "'re", "'ll", "n't", "'D", "’s"]),
        lambda: "".join(rng.choices(".,;:!?()[]{}<>|/\\\"'`~@#$%^&*-_=+", k=rng.randint(1, 4))),
        lambda: rng.choice(["日本語", "über", "naïve", "Ελληνικά", "русский", "١٢٣", "½", "²"]),
        lambda: rng.choice(["😀", "👍🏽", "🇫🇷", "\u200b", "é", "ñ", "ß", "€"]),
        lambda: chr(rng.randint(0x20, 0x2FFF)),
    ]
    return "".join(rng.choice(pieces)() for _ in range(rng.randint(1, 20)))
