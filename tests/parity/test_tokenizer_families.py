"""Tokenizers of the model families people run, built from GGUF metadata, against
llama.cpp on the same file: Qwen2 and Llama 3 byte-level BPE, SentencePiece for
Llama 2 / Mistral and Phi-3 (real vocabularies from llama.cpp's own vocab GGUFs)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from studies.models.vocab_files import vocab_file
from tandem.common.tokenizer import TextTokenizer, piece_table, tokenizer_spec_from_gguf
from tests.parity import llama_ref

pytestmark = pytest.mark.model
FAMILIES = ["qwen2", "llama-bpe", "llama-spm", "phi-3"]
MESSAGES = [{"role": "user", "content": "What is 12 + 30?\nAnswer briefly."}]


def family_vocab(name: str) -> Path:
    try:
        return vocab_file(name)
    except FileNotFoundError as e:
        pytest.skip(f"no {name} vocabulary here: {e}")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest):
    path = family_vocab(request.param)
    with llama_ref.llama_vocab(path) as vocab:
        yield request.param, TextTokenizer(tokenizer_spec_from_gguf(path)), vocab


def test_ids_match_llama_cpp_on_random_text(family) -> None:
    _, tok, vocab = family
    rng = random.Random(0)
    texts = [llama_ref.random_text(rng) for _ in range(300)] + ["", " ", "  Hello\n\nworld "]
    skip_bos = int(tok.spec.add_bos)  # llama_ref tokenizes without BOS
    mismatches = [
        t
        for t in texts
        if tok.encode(t, parse_special=False)[skip_bos:]
        != llama_ref.llama_tokenize(vocab, t, False)
    ]
    assert mismatches == []


def test_chat_prompt_matches_llama_cpp(family) -> None:
    name, tok, vocab = family
    if tok.spec.chat_template is None:
        pytest.skip(f"the {name} vocabulary carries no chat template")
    prompt = tok.apply_chat_template(MESSAGES)
    skip_bos = int(tok.spec.add_bos)
    assert tok.encode(prompt)[skip_bos:] == llama_ref.llama_tokenize(vocab, prompt, True)


def test_round_trip_and_end_of_generation(family) -> None:
    _, tok, vocab = family
    rng = random.Random(1)
    for text in [llama_ref.random_text(rng) for _ in range(100)]:
        assert tok.decode(tok.encode(text, parse_special=False), skip_special=True) == text
    assert set(tok.spec.eos_ids) == llama_ref.llama_eog_ids(vocab)


def test_token_pieces_match_llama_cpp(family) -> None:
    """The MLX worker streams text from piece_table: each id's bytes as llama.cpp's."""
    _, tok, vocab = family
    table = piece_table(tok.spec, tok.vocab_size)
    ids = random.Random(2).sample(range(tok.vocab_size), 3000)
    assert [table[i] for i in ids] == [llama_ref.llama_piece(vocab, i) for i in ids]


def test_spm_prefix_space_and_byte_fallback() -> None:
    tok = TextTokenizer(tokenizer_spec_from_gguf(family_vocab("llama-spm")))
    ids = tok.encode("Hello", parse_special=False)
    assert ids[0] == tok.spec.bos_id and tok.decode(ids[1:]) == "Hello"
    assert tok._tok.id_to_token(ids[1]).startswith("\u2581")  # the prefix space
    emoji = tok.encode("🦙", parse_special=False)[1:]
    assert [tok._tok.id_to_token(i) for i in emoji[-4:]] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
