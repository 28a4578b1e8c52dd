"""The lower bound on a text's token count that lets the router refuse an oversize
prompt untokenized (common/tokenizer.py ``max_piece_chars``): it holds for the
embedded model's tokenizer on any text, and is withheld where it would not hold."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers

from tandem.common.model_files import default_model_path
from tandem.common.spm import build_spm_tokenizer
from tandem.common.tokenizer import TextTokenizer, TokenizerSpec, tokenizer_spec_from_gguf


@functools.cache
def smollm2() -> TextTokenizer:
    return TextTokenizer(tokenizer_spec_from_gguf(default_model_path()))


def wrap(tok: Tokenizer) -> TextTokenizer:
    return TextTokenizer(TokenizerSpec(tok.to_str(), None, (0,), None, False))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=600) | st.text(alphabet="- =\n\t#*\x1d\x04", max_size=2000))
def test_no_text_is_fewer_tokens_than_its_bound(text: str) -> None:
    tok = smollm2()
    assert tok.max_piece_chars == 81
    assert len(tok.encode(text)) >= tok.fewest_tokens(text)


def test_characters_the_vocabulary_lacks_are_left_out_of_the_bound() -> None:
    """SmolLM2's byte-level vocabulary lacks six ASCII control characters: they
    encode to nothing (found by the property test above), so they count for nothing."""
    tok = smollm2()
    assert tok.encode("\x1d" * 200) == []
    assert tok.fewest_tokens("\x1d" * 200) == 0
    assert tok.fewest_tokens("\x1d" * 200 + "a" * 162) == 2


def test_a_long_run_of_the_longest_pieces_meets_the_bound_closely() -> None:
    """The bound is not loose by construction: text made of the longest vocabulary
    entry encodes near one token per entry."""
    tok = smollm2()
    vocab = tok._tok.get_vocab()
    longest = max(vocab, key=len)
    text = tok._tok.decode([vocab[longest]]) * 50
    assert len(tok.encode(text)) <= 60


def test_no_bound_where_an_unknown_stretch_becomes_one_token() -> None:
    word_level = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    assert wrap(word_level).max_piece_chars is None  # any text -> [0]
    no_bytes = Tokenizer(models.BPE({"<unk>": 0, "a": 1}, [], unk_token="<unk>", fuse_unk=True))
    assert wrap(no_bytes).max_piece_chars is None


def test_no_bound_where_the_normalizer_may_shorten_text() -> None:
    pieces = ["<unk>", "a", "b", "ab"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = build_spm_tokenizer(pieces, [0.0] * len(pieces), 0, add_space_prefix=False)
    tok.normalizer = None
    assert wrap(tok).max_piece_chars == 6
    tok.normalizer = normalizers.NFC()
    assert wrap(tok).max_piece_chars is None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("_"), normalizers.Replace(" ", "_")])
    assert wrap(tok).max_piece_chars == 6


def test_no_bound_where_characters_outside_the_vocabulary_vanish() -> None:
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    assert wrap(bpe).max_piece_chars is None  # "xyz" -> []: no byte level, no fallback


def test_a_sentencepiece_vocabulary_with_every_byte_has_a_bound() -> None:
    pieces = ["<unk>", "▁a", "b"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = build_spm_tokenizer(pieces, [0.0] * len(pieces), 0, add_space_prefix=True)
    bound = wrap(tok).max_piece_chars
    assert bound == 6  # "<0x41>": a byte token's entry is longer than what it matches
    text = "ab ü€ xyz" * 3
    assert len(wrap(tok).encode(text)) >= wrap(tok).fewest_tokens(text) > 0
