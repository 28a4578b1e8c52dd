"""Text <-> token ids, built from a GGUF file's own vocabulary.

The router tokenizes once and sends ids to every worker, so ids here must be
exactly the ids llama.cpp would produce for the same text. A worker ships its
`TokenizerSpec` in its READY message; the router rebuilds a `TextTokenizer` from it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, models

from tandem.common.bpe import LLAMA3_PRES, bpe_tokenizer
from tandem.common.gguf_file import read_gguf_header
from tandem.common.spm import build_spm_tokenizer

log = logging.getLogger(__name__)

SPEC_FORMAT = 2  # bump when the GGUF -> spec conversion changes: disk-cached specs are rebuilt

# GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
_TOKEN_UNKNOWN = 2
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# llama.cpp ends generation on these texts whatever the metadata says
# (llama-vocab.cpp, "special_eog_ids"), including its FIM pad/repo/sep tokens.
# fmt: off
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
    # FIM pad / repo / sep
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
})
# fmt: on

_ADD_BOS_BY_DEFAULT = LLAMA3_PRES | {"tekken", "chameleon"}


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything needed to rebuild the model's tokenizer in another process."""

    tokenizer_json: str  # an HF `tokenizers` JSON document
    chat_template: str | None  # Jinja text from GGUF `tokenizer.chat_template`
    eos_ids: tuple[int, ...]  # every id that ends generation, the metadata's eos first
    bos_id: int | None
    add_bos: bool

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-able dict (travels in a worker's READY message)."""
        return {
            "tokenizer_json": self.tokenizer_json,
            "chat_template": self.chat_template,
            "eos_ids": list(self.eos_ids),
            "bos_id": self.bos_id,
            "add_bos": self.add_bos,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TokenizerSpec:
        """Inverse of `to_wire`; raises ValueError on anything malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"tokenizer spec must be a dict, got {type(d).__name__}")
        expected = {"tokenizer_json", "chat_template", "eos_ids", "bos_id", "add_bos"}
        if set(d) != expected:
            raise ValueError(f"tokenizer spec keys {sorted(d)} != {sorted(expected)}")
        tj, tmpl, eos = d["tokenizer_json"], d["chat_template"], d["eos_ids"]
        bos, add_bos = d["bos_id"], d["add_bos"]
        if not isinstance(tj, str) or not tj.lstrip().startswith("{"):
            raise ValueError("tokenizer_json must be a JSON object string")
        if tmpl is not None and not isinstance(tmpl, str):
            raise ValueError("chat_template must be a string or None")
        if not isinstance(eos, list | tuple) or not all(_is_id(i) for i in eos):
            raise ValueError(f"eos_ids must be a list of non-negative ints, got {eos!r}")
        if bos is not None and not _is_id(bos):
            raise ValueError(f"bos_id must be a non-negative int or None, got {bos!r}")
        if not isinstance(add_bos, bool) or (add_bos and bos is None):
            raise ValueError("add_bos must be a bool, and needs a bos_id")
        return cls(tj, tmpl, tuple(eos), bos, add_bos)


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def tokenizer_spec_from_gguf(path: str | Path) -> TokenizerSpec:
    """Read a GGUF file's tokenizer metadata (no weights) into a `TokenizerSpec`.

    Cached per (path, size, mtime) in memory and on disk (under the cache root):
    reading ~50k tokens out of a GGUF takes seconds, and every worker start needs it.
    """
    resolved = Path(path).resolve()
    st = resolved.stat()
    return _spec_from_disk_or_gguf(str(resolved), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _spec_from_disk_or_gguf(path: str, size: int, mtime_ns: int) -> TokenizerSpec:
    from tandem.common.model_files import cache_root

    key = f"{path}|{size}|{mtime_ns}|{SPEC_FORMAT}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    cached = cache_root() / "tokenizers" / f"{Path(path).stem}-{digest}.json"
    try:
        return TokenizerSpec.from_wire(json.loads(cached.read_text()))
    except (OSError, ValueError):
        pass  # absent or unreadable: rebuild it
    spec = _spec_from_gguf_cached(path, mtime_ns)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(spec.to_wire()))
        tmp.replace(cached)  # atomic: concurrent workers never read half a file
    except OSError as exc:
        log.warning("cannot cache the tokenizer at %s: %s", cached, exc)
    return spec


@functools.lru_cache(maxsize=8)
def _spec_from_gguf_cached(path: str, mtime_ns: int) -> TokenizerSpec:
    meta = GgufMeta(path)
    model = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens")
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    pre = meta.get("tokenizer.ggml.pre") or "default"
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if model == "gpt2":
        tok = bpe_tokenizer(tokens, meta.get("tokenizer.ggml.merges"), pre)
        if add_bos is None:
            add_bos = pre in _ADD_BOS_BY_DEFAULT
    elif model == "llama":
        add_space_prefix = meta.get("tokenizer.ggml.add_space_prefix")
        tok = build_spm_tokenizer(
            tokens,
            meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens),
            meta.get("tokenizer.ggml.unknown_token_id"),
            add_space_prefix is not False,  # llama.cpp's default for SPM is on
        )
        add_bos = add_bos is not False
    else:
        raise ValueError(
            f"{path}: tokenizer model {model!r} is not supported "
            "(only 'gpt2' BPE and 'llama' SentencePiece)"
        )
    _add_special_tokens(tok, tokens, types, _rstrip_ids(meta.get("general.name"), tokens, types))

    eos_ids = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos_ids += [i for i, t in enumerate(tokens) if t in EOG_TEXTS]
    return TokenizerSpec(
        tokenizer_json=tok.to_str(),
        chat_template=meta.get("tokenizer.chat_template"),
        eos_ids=tuple(dict.fromkeys(i for i in eos_ids if i is not None)),  # dedup, keep order
        bos_id=bos_id,
        add_bos=bool(add_bos) and bos_id is not None,
    )


class GgufMeta:
    """A GGUF file's key/values (its header only, no tensor data)."""

    def __init__(self, path: str | Path) -> None:
        self.header = read_gguf_header(path)

    def get(self, key: str) -> Any:
        """The value of `key` (lists for arrays), or None when absent."""
        return self.header.kv.get(key)


def _rstrip_ids(name: str | None, tokens: list[str], types: list[int]) -> frozenset[int]:
    """Tokens that eat the whitespace after them: llama.cpp sets this for Phi-3 models
    (by `general.name`) on its special tokens and `</s>`, except `<unk>`, `<s>` and
    `<|endoftext|>` (llama-vocab.cpp, "set attributes by model name")."""
    if not name or not any(n in name.lower() for n in ("phi-3", "phi3")):
        return frozenset()
    special = (_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED)
    ids = {i for i, t in enumerate(types) if t in special} | {
        i for i, text in enumerate(tokens) if text == "</s>"
    }
    return frozenset(i for i in ids if tokens[i] not in ("<unk>", "<s>", "<|endoftext|>"))


def _add_special_tokens(
    tok: Tokenizer, tokens: list[str], types: list[int], rstrip: frozenset[int]
) -> None:
    """Control (and unknown) tokens are matched in text only when special parsing is
    on; user-defined ones always (llama.cpp tokenizer_st_partition)."""
    control = [i for i, t in enumerate(types) if t in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)]
    user = [i for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED]

    def added(i: int, special: bool) -> AddedToken:
        return AddedToken(tokens[i], special=special, normalized=False, rstrip=i in rstrip)

    tok.add_special_tokens([added(i, True) for i in control])
    tok.add_tokens([added(i, False) for i in user])


class TextTokenizer:
    """Encode, decode and chat-format text with a model's own tokenizer."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        self._tok = Tokenizer.from_str(spec.tokenizer_json)
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self._template = _compile_template(spec.chat_template)

    @functools.cached_property
    def _tok_plain(self) -> Tokenizer:
        """A second instance that reads control-token text as plain text."""
        tok = Tokenizer.from_str(self.spec.tokenizer_json)
        tok.encode_special_tokens = True
        return tok

    def encode(
        self, text: str, *, parse_special: bool = True, release_gil: bool = False
    ) -> list[int]:
        """Token ids as llama.cpp's `llama_tokenize` gives them (BOS only if `add_bos`).

        With `parse_special` (the default, needed for chat-template output),
        control-token text such as ``<|im_start|>`` becomes its single id.
        `release_gil`: encode as a batch of one, which the tokenizers library runs
        without the GIL (its `encode` holds it throughout): for a thread beside a
        loop that must keep running (broker/tokenize.py). The fast batch keeps no
        offsets: same ids, and freeing its result no longer holds the GIL for
        ~25 ms per Mi characters.
        """
        tok = self._tok if parse_special else self._tok_plain
        if release_gil:
            batch = getattr(tok, "encode_batch_fast", tok.encode_batch)  # tokenizers >= 0.20.2
            ids = batch([text], add_special_tokens=False)[0].ids
        else:
            ids = tok.encode(text, add_special_tokens=False).ids
        if self.spec.add_bos and self.spec.bos_id is not None:
            ids.insert(0, self.spec.bos_id)
        return ids

    @functools.cached_property
    def _bound(self) -> tuple[int, str] | None:
        """(the most characters one token can stand for, the characters that encode to
        no token at all), or None where no lower bound on a text's token count holds.

        A vocabulary entry's length bounds what it matches (byte-level entries spell one
        character per byte, and a character is at least a byte), once the characters
        the tokenizer drops are left out: a byte-level vocabulary may lack a few bytes
        (SmolLM2's lacks six ASCII control characters, which then vanish). None where
        the normalizer may shorten the text (NFC composes characters), where an unknown
        stretch of text may become one token (a word-level model's, or a BPE's unknown
        token without byte fallback), or where a byte-level vocabulary lacks a
        continuation byte (every multi-byte character keeps its continuation bytes
        otherwise, so only single-byte characters can vanish whole)."""
        model, normalizer = self._tok.model, self._tok.normalizer
        if not isinstance(model, models.BPE):
            return None
        if normalizer is not None and not _never_shortens(json.loads(normalizer.__getstate__())):
            return None  # (the normalizer's own JSON: small, unlike the spec's)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        every_byte = model.byte_fallback and all(f"<0x{b:02X}>" in vocab for b in range(256))
        if every_byte:
            dropped = ""
        elif model.unk_token is not None:
            return None
        else:
            pre = self._tok.pre_tokenizer
            if pre is None or b'"ByteLevel"' not in pre.__getstate__():
                return None  # characters outside the vocabulary vanish: no bound
            missing = [b for b, c in enumerate(_BYTE_CHARS) if c not in vocab]
            if any(0x80 <= b <= 0xBF for b in missing):
                return None  # a multi-byte character could vanish whole
            dropped = "".join(chr(b) for b in missing if b < 0x80)
        return max(map(len, vocab), default=1) or 1, dropped

    @property
    def max_piece_chars(self) -> int | None:
        """The most characters of text one token can stand for (None: no bound)."""
        return None if self._bound is None else self._bound[0]

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on ``len(self.encode(text))`` that costs no tokenizing (a few
        C passes over the text): what lets the router refuse a prompt no worker's
        context could hold. 0 where no bound holds."""
        if self._bound is None:
            return 0
        per_token, dropped = self._bound
        return (len(text) - sum(text.count(c) for c in dropped)) // per_token

    def decode(self, ids: list[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; an incomplete UTF-8 sequence at the end decodes as U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        """Render `messages` with the model's chat template, ready for the reply.

        Raises ValueError when the model has no template, a message is not a dict
        with string ``role`` and ``content``, or the template itself rejects them.
        """
        if self._template is None:
            raise ValueError("this model has no chat template")
        _check_messages(messages)
        bos = self._token_text(self.spec.bos_id)
        eos = self._token_text(self.spec.eos_ids[0] if self.spec.eos_ids else None)
        try:
            text = self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
            )
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template failed: {e}") from e
        if self.spec.add_bos and bos and text.startswith(bos):
            # encode() adds BOS itself; llama.cpp drops the template's copy likewise.
            text = text[len(bos) :]
        return text

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self._tok.id_to_token(token_id) or "")


def _gpt2_byte_chars() -> list[str]:
    """The character byte-level BPE vocabularies spell each byte with (GPT-2's map:
    printable Latin-1 bytes as themselves, the rest as U+0100 onwards, in order)."""
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    spare = iter(range(0x100, 0x200))
    return [chr(b) if b in keep else chr(next(spare)) for b in range(256)]


_BYTE_CHARS = _gpt2_byte_chars()


def _never_shortens(normalizer: dict[str, Any] | None) -> bool:
    """Whether a tokenizers normalizer (its JSON form) keeps every character or adds
    some: none at all, prepending, lowercasing, or replacing a literal with one at
    least as long (SentencePiece's space -> U+2581)."""
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_never_shortens(n) for n in normalizer.get("normalizers", []))
    if kind in ("Prepend", "Lowercase"):
        return True
    if kind == "Replace":
        literal = normalizer.get("pattern", {}).get("String")
        return literal is not None and len(normalizer.get("content", "")) >= len(literal)
    return False


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"message {i} must be a dict")
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} needs string 'role' and 'content'")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _compile_template(source: str | None) -> jinja2.Template | None:
    """Compile like HF transformers does, so templates written for it render the same."""
    if source is None:
        return None
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template does not compile: {e}") from e


# ------------------------------------------------------------ token pieces
def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def piece_table(spec: TokenizerSpec, vocab_size: int | None = None) -> list[bytes]:
    """The bytes of every token id, as llama.cpp renders them with special tokens:
    byte-level BPE text decoded to raw bytes (possibly a partial UTF-8 character),
    added tokens (control ones too) as their text, so that a special token kept in
    the output (ignore_eos) is streamed and the text says every token counted. ``vocab_size``
    defaults to one past the highest id the tokenizer names."""
    doc = json.loads(spec.tokenizer_json)
    vocab = doc.get("model", {}).get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError("token pieces need a BPE tokenizer (a vocab dict)")
    if vocab_size is None:
        ids = [*vocab.values(), *(int(t["id"]) for t in doc.get("added_tokens", []))]
        vocab_size = max(ids, default=-1) + 1
    byte_level = "ByteLevel" in json.dumps(doc.get("decoder"))
    byte_of = _gpt2_byte_decoder()
    table = [b""] * vocab_size
    for text, i in vocab.items():
        if i >= vocab_size or text == f"[EMPTY_{i}]":
            continue
        if byte_level and all(c in byte_of for c in text):
            table[i] = bytes(byte_of[c] for c in text)
        elif not byte_level and len(text) == 6 and text.startswith("<0x") and text[-1] == ">":
            table[i] = bytes([int(text[3:5], 16)])  # SentencePiece byte fallback
        else:
            table[i] = text.replace("\u2581", " ").encode() if not byte_level else text.encode()
    for t in doc.get("added_tokens", []):
        if t["id"] < vocab_size:
            table[t["id"]] = t["content"].encode()
    return table
