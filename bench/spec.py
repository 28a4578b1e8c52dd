"""Worker specs on the bench command line: ``BACKEND[:ITEM[:ITEM...]]``.

An ITEM is ``key=value`` (becomes the ``tandem worker`` flag ``--key value``,
underscores turned into dashes) or a bare value, the backend's main file: the
profile for ``sim``, the model for ``llama.cpp`` and ``mlx``. ``id=NAME`` names
the worker. Items are separated by ``:`` so that values may hold commas
(``decode_tok_s=45,58,68``). Examples::

    llama.cpp:threads=8          mlx:device=gpu          sim:gpu-m2
    sim:gpu-m2:id=gpu:decode_tok_s=293,533,720,902

Nothing here knows which backends exist beyond their main-file flag, so the same
bench command runs on a laptop (sim + llama.cpp) and on a GPU box (mlx) unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tandem.launcher.cluster import WorkerSpec

_MAIN_FILE_FLAG = {"sim": "--profile", "llama.cpp": "--model", "mlx": "--model"}
# Flags the bench sets itself per case; a spec may still give them (see WorkerArg).
_BENCH_KEYS = {"max_active", "n_ctx"}


@dataclass(frozen=True)
class WorkerArg:
    """One parsed ``--worker`` spec."""

    text: str  # as the user wrote it
    worker_id: str
    backend: str
    flags: tuple[str, ...]  # extra ``tandem worker`` flags, bench-managed ones excluded
    max_active: int | None = None  # from the spec; the bench default otherwise
    n_ctx: int | None = None
    model: str | None = None  # the GGUF, when the spec names one (prompts tokenize with it)

    def cluster_spec(self, max_active: int, n_ctx: int, heartbeat_s: float) -> WorkerSpec:
        """The process to start for one case: spec flags, then the case's sizes."""
        args = ["--backend", self.backend, *self.flags]
        args += ["--max-active", str(max_active), "--n-ctx", str(self.n_ctx or n_ctx)]
        if "--heartbeat-s" not in self.flags:
            args += ["--heartbeat-s", str(heartbeat_s)]
        return WorkerSpec(self.worker_id, args)


def parse_worker(text: str, taken: set[str]) -> WorkerArg:
    """Parse one spec; ``taken`` holds ids already used (a default id gets a suffix)."""
    backend, *items = text.split(":")
    if backend not in _MAIN_FILE_FLAG:
        raise ValueError(f"worker {text!r}: backend must be one of {sorted(_MAIN_FILE_FLAG)}")
    flags: list[str] = []
    opts: dict[str, str] = {}
    main_file: str | None = None
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            if main_file is not None:
                raise ValueError(f"worker {text!r}: two bare values ({main_file!r}, {item!r})")
            main_file = item
            continue
        if not key or not value:
            raise ValueError(f"worker {text!r}: bad item {item!r} (want key=value)")
        opts[key.replace("-", "_")] = value
    if main_file is not None:
        key = _MAIN_FILE_FLAG[backend].lstrip("-")
        opts.setdefault(key, main_file)
    worker_id = opts.pop("id", None) or _default_id(backend, opts, taken)
    if worker_id in taken:
        raise ValueError(f"worker id {worker_id!r} used twice")
    taken.add(worker_id)
    sizes = {k: _positive_int(text, k, opts.pop(k)) for k in _BENCH_KEYS if k in opts}
    for key, value in opts.items():
        flags += ["--" + key.replace("_", "-"), value]
    return WorkerArg(
        text,
        worker_id,
        backend,
        tuple(flags),
        sizes.get("max_active"),
        sizes.get("n_ctx"),
        opts.get("model"),
    )


def parse_workers(texts: list[str] | tuple[str, ...]) -> tuple[WorkerArg, ...]:
    """Parse every ``--worker``; at least one is needed."""
    if not texts:
        raise ValueError("name at least one --worker")
    taken: set[str] = set()
    return tuple(parse_worker(t, taken) for t in texts)


def _default_id(backend: str, opts: dict[str, str], taken: set[str]) -> str:
    """sim: the profile's file stem (``gpu-m2``); llama.cpp: ``llama``; mlx: ``mlx-DEVICE``."""
    if backend == "sim" and "profile" in opts:
        base = Path(opts["profile"]).stem
    elif backend == "mlx":
        base = f"mlx-{opts.get('device', 'auto')}"
    else:
        base = backend.replace(".cpp", "")
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def _positive_int(text: str, key: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"worker {text!r}: {key} must be an integer") from None
    if n < 1:
        raise ValueError(f"worker {text!r}: {key} must be >= 1")
    return n
