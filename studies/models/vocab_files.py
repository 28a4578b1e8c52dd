"""Real tokenizer vocabularies of the model families, without a model hub.

llama.cpp keeps vocabulary-only GGUFs of the families it tokenizes (its tokenizer
tests read them): `ggml-vocab-qwen2.gguf`, `-llama-bpe` (Llama 3), `-llama-spm`
(Llama 2 / Mistral), `-phi-3`, ... They travel inside llama-cpp-python's source
archive on PyPI. `vocab_file(name)` takes one from the cache, else downloads that
archive once with pip and extracts every vocabulary into the cache.

    python -m studies.models.vocab_files qwen2    # prints the path
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tandem.common.model_files import cache_root

PACKAGE = "llama-cpp-python"
FALLBACK_VERSION = "0.3.36"
MEMBER_DIR = "/vendor/llama.cpp/models/"
DOWNLOAD_TIMEOUT_S = 600


def vocab_dir() -> Path:
    return cache_root() / "vocab"


def vocab_file(name: str) -> Path:
    """Path of `ggml-vocab-<name>.gguf`; FileNotFoundError if it cannot be had."""
    path = vocab_dir() / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        _extract_all(_download_sdist())
    if not path.is_file():
        raise FileNotFoundError(f"{path.name} is not in {PACKAGE}'s source archive")
    return path


def _download_sdist() -> Path:
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = FALLBACK_VERSION
    out = Path(tempfile.mkdtemp(prefix="tandem-vocab-"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--quiet", "-d", str(out), f"{PACKAGE}=={version}"]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, timeout=DOWNLOAD_TIMEOUT_S, capture_output=True)
    except (subprocess.SubprocessError, OSError) as e:
        raise FileNotFoundError(f"could not download {PACKAGE} {version}'s source: {e}") from e
    archives = list(out.glob("*.tar.gz"))
    if not archives:
        raise FileNotFoundError(f"pip left no source archive of {PACKAGE} in {out}")
    return archives[0]


def _extract_all(archive: Path) -> None:
    """Copy every ggml-vocab-*.gguf out of the archive, each file written atomically."""
    target = vocab_dir()
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar:
            name = member.name.rsplit("/", 1)[-1]
            if not (member.isfile() and MEMBER_DIR in member.name and name.endswith(".gguf")):
                continue
            data = tar.extractfile(member)
            if data is None or not name.startswith("ggml-vocab-"):
                continue
            tmp = target / f".{name}.tmp"
            tmp.write_bytes(data.read())
            tmp.replace(target / name)
    archive.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="e.g. qwen2, llama-bpe, llama-spm, phi-3")
    print(vocab_file(ap.parse_args().name))


if __name__ == "__main__":
    main()
