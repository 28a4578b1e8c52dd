"""The tokenizer half of a shaped GGUF: a real family's vocabulary copied key by key.

Where a family's own vocabulary is not to be had here (Gemma 1/2), a synthetic one
exercises the same tokenizer: Gemma is SentencePiece without the prefix space,
with its turn markers as control tokens, so Llama 2's SentencePiece vocabulary
with those changes tokenizes the way a Gemma file does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.common.gguf_file import read_gguf_header

UNUSED_TOKEN = 5  # llama_token_type LLAMA_TOKEN_TYPE_UNUSED
CONTROL_TOKEN = 3

# Chat templates of families whose vocabulary files carry none (written for tandem,
# rendering what the families' own templates render for plain user/assistant turns).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass(frozen=True)
class VocabSource:
    """Where a shaped model's tokenizer comes from, and what is changed on the way."""

    vocab: str | None = None  # llama.cpp vocab name (vocab_files.py); None: the default model
    chat_template: str | None = None  # replaces the source's (None: keep it)
    control_tokens: tuple[str, ...] = ()  # appended as control tokens
    add_space_prefix: bool | None = None  # SentencePiece only; None: keep the source's


GEMMA_VOCAB = VocabSource(
    "llama-spm",
    GEMMA_TEMPLATE,
    control_tokens=("<start_of_turn>", "<end_of_turn>"),
    add_space_prefix=False,
)


def source_path(source: VocabSource) -> Path:
    from studies.models.vocab_files import vocab_file
    from tandem.common.model_files import default_model_path

    return default_model_path() if source.vocab is None else vocab_file(source.vocab)


def tokenizer_kv(source: VocabSource, vocab_size: int | None) -> tuple[dict[str, Any], int]:
    """(tokenizer.* key -> (value, type, item type), final vocabulary size)."""
    from gguf import GGUFValueType as T

    header = read_gguf_header(source_path(source))
    kv = {
        k: (v, T(header.types[k][0]), _item(header.types[k][1]))
        for k, v in header.kv.items()
        if k.startswith("tokenizer.")
    }
    tokens = list(kv["tokenizer.ggml.tokens"][0])
    types = list(kv.get("tokenizer.ggml.token_type", ([1] * len(tokens),))[0])
    scores = list(kv.get("tokenizer.ggml.scores", ([0.0] * len(tokens),))[0])
    tokens += source.control_tokens
    types += [CONTROL_TOKEN] * len(source.control_tokens)
    size = vocab_size or len(tokens)
    if len(tokens) > size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, more than {size}")
    pad = size - len(tokens)
    tokens += [f"<|tandem_unused_{i}|>" for i in range(pad)]
    types += [UNUSED_TOKEN] * pad
    scores += [-1e9] * (len(tokens) - len(scores))  # never preferred by SentencePiece merges
    kv["tokenizer.ggml.tokens"] = (tokens, T.ARRAY, T.STRING)
    kv["tokenizer.ggml.token_type"] = (types, T.ARRAY, T.INT32)
    if "tokenizer.ggml.scores" in kv:
        kv["tokenizer.ggml.scores"] = (scores, T.ARRAY, T.FLOAT32)
    if source.chat_template is not None:
        kv["tokenizer.chat_template"] = (source.chat_template, T.STRING, None)
    if source.add_space_prefix is not None:
        kv["tokenizer.ggml.add_space_prefix"] = (source.add_space_prefix, T.BOOL, None)
    return kv, size


def _item(code: int | None) -> Any:
    from gguf import GGUFValueType

    return None if code is None else GGUFValueType(code)
