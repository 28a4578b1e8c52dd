"""Load a model into mlx-lm for the MLX worker.

A GGUF file is converted once (`gguf.py`: per-family tensor names and layouts,
quantized weights kept or re-quantized) and cached on disk as an
mlx-lm model folder, so a restart skips the conversion. A folder in mlx-lm / HF
layout loads directly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from tokenizers import Tokenizer

from tandem.common.gguf_file import DIGEST_SAMPLE_BYTES, weights_digest
from tandem.common.model_files import cache_root, default_model_path
from tandem.common.tokenizer import EOG_TEXTS, TokenizerSpec, tokenizer_spec_from_gguf
from tandem.workers.backends.mlx.arch import finish_model
from tandem.workers.backends.mlx.gguf import convert_gguf

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # bump when the conversion changes, so old caches are rebuilt
SPEC_FILE = "tokenizer_spec.json"
MARKER_FILE = "tandem.json"  # written into every converted folder, records CACHE_FORMAT
# config.json key: the source GGUF's weights digest, so a converted folder and its GGUF
# are known to serve the same weights (Ready.weights)
WEIGHTS_KEY = "tandem_weights"


def load_mlx_model(
    path: str | Path, cache_dir: Path | None = None
) -> tuple[nn.Module, TokenizerSpec, dict[str, Any]]:
    """Load `path` (a ``.gguf`` file or an mlx-lm folder) as (model, tokenizer spec, config).

    GGUF files are converted on first use and cached under `cache_dir`
    (default ``$TANDEM_CACHE_DIR/mlx`` or ``~/.cache/tandem/mlx``).
    """
    path = Path(path)
    if path.is_dir():
        return _load_folder(path)
    if not path.is_file():
        raise FileNotFoundError(f"model not found: {path}")
    if path.suffix != ".gguf":
        raise ValueError(f"{path}: expected a .gguf file or an mlx-lm folder")
    target = gguf_cache_path(path, cache_dir)
    if _is_current_cache(target):
        try:
            return _load_folder(target)
        except (OSError, ValueError, KeyError, RuntimeError) as e:  # RuntimeError: mx.load
            log.warning("cached model %s unusable (%s): converting again", target, e)
            shutil.rmtree(target, ignore_errors=True)
    start_s = time.monotonic()
    model, spec, config = convert_gguf(path)
    config[WEIGHTS_KEY] = weights_digest(path)
    log.info("converted %s for MLX in %.1f s", path.name, time.monotonic() - start_s)
    try:
        _save_folder_atomically(target, model, spec, config, source=path)
    except OSError as e:  # a read-only cache costs a conversion per start, nothing more
        log.warning("could not cache the converted model in %s: %s", target, e)
    return model, spec, config


def gguf_cache_path(path: str | Path, cache_dir: Path | None = None) -> Path:
    """Folder that holds (or will hold) the converted copy of the GGUF file `path`."""
    st = Path(path).stat()
    root = cache_dir if cache_dir is not None else cache_root() / "mlx"
    return root / f"{Path(path).stem}-{st.st_size}-{st.st_mtime_ns}"


def _is_current_cache(folder: Path) -> bool:
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == CACHE_FORMAT


# --- folders: the disk cache and mlx-lm / HF layouts --------------------------------


def _save_folder_atomically(
    target: Path, model: nn.Module, spec: TokenizerSpec, config: dict[str, Any], source: Path
) -> None:
    """Write an mlx-lm model folder into a temp dir beside `target`, then rename it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the cache may be shared
        weights = dict(tree_flatten(model.parameters()))
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        (tmp / SPEC_FILE).write_text(json.dumps(spec.to_wire()))
        # tokenizer.json + tokenizer_config.json make the folder usable by mlx-lm's own tools.
        (tmp / "tokenizer.json").write_text(spec.tokenizer_json)
        (tmp / "tokenizer_config.json").write_text(json.dumps(_hf_tokenizer_config(spec)))
        (tmp / MARKER_FILE).write_text(json.dumps({"format": CACHE_FORMAT, "source": str(source)}))
        if target.exists() and not _is_current_cache(target):
            shutil.rmtree(target)  # stale format or a broken copy
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_current_cache(target):  # another process won the race: fine
            return
        raise


def _hf_tokenizer_config(spec: TokenizerSpec) -> dict[str, Any]:
    tok = Tokenizer.from_str(spec.tokenizer_json)
    eos_id = spec.eos_ids[0] if spec.eos_ids else None
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": spec.chat_template,
        "bos_token": None if spec.bos_id is None else tok.id_to_token(spec.bos_id),
        "eos_token": None if eos_id is None else tok.id_to_token(eos_id),
        "add_bos_token": spec.add_bos,
    }


def _load_folder(folder: Path) -> tuple[nn.Module, TokenizerSpec, dict[str, Any]]:
    from mlx_lm.utils import load_model

    spec = _spec_from_folder(folder)
    model, config = load_model(folder)
    if WEIGHTS_KEY not in config:  # a folder tandem did not convert: its own tensors' digest
        config[WEIGHTS_KEY] = safetensors_digest(folder)
    finish_model(model, config)
    model.eval()
    return model, spec, config


def _spec_from_folder(folder: Path) -> TokenizerSpec:
    """Our own spec file if present, else one built from HF tokenizer files."""
    if (folder / SPEC_FILE).is_file():
        return TokenizerSpec.from_wire(json.loads((folder / SPEC_FILE).read_text()))
    tokenizer_json = (folder / "tokenizer.json").read_text()
    tok = Tokenizer.from_str(tokenizer_json)
    tok_config = _read_json(folder / "tokenizer_config.json")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()

    def token_id(entry: Any) -> int | None:
        text = entry.get("content") if isinstance(entry, dict) else entry
        return tok.token_to_id(text) if isinstance(text, str) else None

    eos: list[int | None] = [token_id(tok_config.get("eos_token"))]
    for name in ("config.json", "generation_config.json"):
        value = _read_json(folder / name).get("eos_token_id")
        eos += value if isinstance(value, list) else [value]
    vocab = tok.get_vocab(with_added_tokens=True)
    eos += sorted(i for text, i in vocab.items() if text in EOG_TEXTS)
    bos_id = token_id(tok_config.get("bos_token"))
    add_bos = tok_config.get("add_bos_token")
    if add_bos is None:  # e.g. Llama 3 adds BOS through its post-processor instead
        post = json.dumps(json.loads(tokenizer_json).get("post_processor"))
        add_bos = bos_id is not None and f'"id": "{tok.id_to_token(bos_id)}"' in post
    return TokenizerSpec(
        tokenizer_json=tokenizer_json,
        chat_template=template,
        eos_ids=tuple(dict.fromkeys(i for i in eos if isinstance(i, int))),
        bos_id=bos_id,
        add_bos=bool(add_bos) and bos_id is not None,
    )


def safetensors_digest(folder: Path) -> str:
    """A digest of an mlx-lm folder's weights: each safetensors header (names, dtypes,
    shapes, offsets) and bytes sampled from the start, middle and end of its data."""
    h = hashlib.blake2b(digest_size=12)
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            h.update(f.read(n))
            for at in (8 + n, (8 + n + size) // 2, size - DIGEST_SAMPLE_BYTES):
                f.seek(max(8 + n, at))
                h.update(f.read(DIGEST_SAMPLE_BYTES))
    return h.hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


# --- a tiny random model for fast tests ---------------------------------------------


def make_tiny_model(
    seed: int = 0,
    vocab_size: int | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
) -> tuple[nn.Module, TokenizerSpec, dict[str, Any]]:
    """A random-weight float32 llama with the real SmolLM2 tokenizer (realistic ids).

    `vocab_size` defaults to the tokenizer's (49152); a smaller one is only safe
    if every id fed to the model is below it.
    """
    spec = tokenizer_spec_from_gguf(default_model_path())
    if vocab_size is None:
        vocab_size = Tokenizer.from_str(spec.tokenizer_json).get_vocab_size(with_added_tokens=True)
    config: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    }
    mx.random.seed(seed)  # the layers draw their initial weights from mx.random
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    model.eval()
    return model, spec, config
