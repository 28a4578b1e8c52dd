"""The GGUF-built tokenizer: round trips, chat template, wire format, llama.cpp parity."""

from __future__ import annotations

import random

import msgpack
import pytest

from tandem.common.model_files import default_model_path
from tandem.common.tokenizer import TextTokenizer, TokenizerSpec, tokenizer_spec_from_gguf
from tests.parity import llama_ref


@pytest.fixture(scope="module")
def spec() -> TokenizerSpec:
    try:
        return tokenizer_spec_from_gguf(default_model_path())
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tok(spec: TokenizerSpec) -> TextTokenizer:
    return TextTokenizer(spec)


_random_text = llama_ref.random_text


def test_round_trip(tok: TextTokenizer) -> None:
    rng = random.Random(1)
    texts = ["Hello, world!", "  leading spaces", "x = 12345 + 0.5\n", "日本語 über 😀"]
    texts += [_random_text(rng) for _ in range(200)]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text


def test_smollm2_facts(spec: TokenizerSpec, tok: TextTokenizer) -> None:
    assert tok.vocab_size == 49152
    assert spec.bos_id == 1 and not spec.add_bos
    assert spec.eos_ids[0] == 2  # <|im_end|>, the metadata's eos, comes first
    # Digits are split one by one (the `smollm` pre-tokenizer).
    assert len(tok.encode("2024")) == 4
    assert tok.encode("<|im_start|>") == [1]
    assert len(tok.encode("<|im_start|>", parse_special=False)) > 1


def test_chat_template_renders_chatml(tok: TextTokenizer) -> None:
    text = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    own_system = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert own_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


@pytest.mark.parametrize(
    "messages",
    [[], "hello", [{"role": "user"}], [{"role": "user", "content": 3}], ["hi"]],
)
def test_chat_template_rejects_malformed(tok: TextTokenizer, messages: object) -> None:
    with pytest.raises(ValueError):
        tok.apply_chat_template(messages)  # type: ignore[arg-type]


def test_no_template_is_value_error(spec: TokenizerSpec) -> None:
    bare = TextTokenizer(TokenizerSpec(spec.tokenizer_json, None, spec.eos_ids, None, False))
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_template_raise_exception_is_value_error(spec: TokenizerSpec) -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    tok = TextTokenizer(TokenizerSpec(spec.tokenizer_json, strict, spec.eos_ids, None, False))
    with pytest.raises(ValueError, match="user first"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])


def test_wire_round_trip_through_msgpack(spec: TokenizerSpec) -> None:
    wire = msgpack.unpackb(msgpack.packb(spec.to_wire()))
    assert TokenizerSpec.from_wire(wire) == spec


@pytest.mark.parametrize(
    "change",
    [
        {"tokenizer_json": 5},
        {"tokenizer_json": "not json"},
        {"chat_template": ["x"]},
        {"eos_ids": [2, -1]},
        {"eos_ids": "2"},
        {"eos_ids": [True]},
        {"bos_id": "1"},
        {"add_bos": 1},
        {"add_bos": True, "bos_id": None},
        {"extra": 1},
    ],
)
def test_from_wire_rejects_bad_dicts(spec: TokenizerSpec, change: dict) -> None:
    wire = {**spec.to_wire(), **change}
    with pytest.raises(ValueError):
        TokenizerSpec.from_wire(wire)


def test_from_wire_rejects_missing_key_and_non_dict(spec: TokenizerSpec) -> None:
    wire = spec.to_wire()
    del wire["bos_id"]
    with pytest.raises(ValueError):
        TokenizerSpec.from_wire(wire)
    with pytest.raises(ValueError):
        TokenizerSpec.from_wire([1, 2])  # type: ignore[arg-type]


def test_spec_is_cached_per_file(spec: TokenizerSpec) -> None:
    assert tokenizer_spec_from_gguf(default_model_path()) is spec


# --- parity with llama.cpp -----------------------------------------------------------


@pytest.fixture(scope="module")
def llama_vocab():
    with llama_ref.llama_vocab(default_model_path()) as vocab:
        yield vocab


_llama_tokenize = llama_ref.llama_tokenize


@pytest.mark.model
def test_ids_match_llama_cpp_on_random_text(tok: TextTokenizer, llama_vocab) -> None:
    rng = random.Random(0)
    texts = [_random_text(rng) for _ in range(500)]
    mismatches = [
        t
        for t in texts
        if tok.encode(t, parse_special=False) != _llama_tokenize(llama_vocab, t, False)
    ]
    assert mismatches == []


@pytest.mark.model
def test_chat_prompt_ids_match_llama_cpp(tok: TextTokenizer, llama_vocab) -> None:
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}])
    assert tok.encode(prompt) == _llama_tokenize(llama_vocab, prompt, True)


@pytest.mark.model
def test_eos_ids_match_llama_cpp_end_of_generation(spec: TokenizerSpec, llama_vocab) -> None:
    assert set(spec.eos_ids) == llama_ref.llama_eog_ids(llama_vocab)


def test_spec_is_cached_on_disk_across_processes(tmp_path, monkeypatch):
    import tandem.common.tokenizer as tk
    from tandem.common.model_files import default_model_path

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    tk._spec_from_disk_or_gguf.cache_clear()
    first = tk.tokenizer_spec_from_gguf(default_model_path())
    assert list((tmp_path / "tokenizers").glob("*.json")), "the spec was written to disk"
    tk._spec_from_disk_or_gguf.cache_clear()  # as a new process would start

    def no_rebuild(*args):
        raise AssertionError("read the GGUF again instead of the disk cache")

    monkeypatch.setattr(tk, "_spec_from_gguf_cached", no_rebuild)
    assert tk.tokenizer_spec_from_gguf(default_model_path()) == first
    tk._spec_from_disk_or_gguf.cache_clear()
