"""``/v1/models``: the served model as OpenAI's model objects.

The id is the model's display name (common/model_files.model_display_name: a Hugging
Face repo id, or the GGUF file's stem without its quantization), the name ``tandem
serve`` also gives the gateway as an alias; the ``--model-alias`` names are listed
as models of their own. ``context_length`` is the largest ``n_ctx`` of the workers
serving it (what the longest prompt + max_tokens can be), and ``owned_by`` the
repo's organisation when the name has one (``Qwen/Qwen2.5-0.5B-Instruct``: ``Qwen``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tandem.common.model_files import model_display_name

READY, STARTING = "ready", "starting"  # a model's status (ours; SDKs keep and ignore it)


@lru_cache(maxsize=64)  # asked per request, and it may look at the file system
def display_name(model: str) -> str:
    """The id clients see for a worker's ``Ready.model``."""
    return model_display_name(model)


def context_lengths(workers: list[dict[str, Any]]) -> dict[str, int]:
    """Each served model's id -> the largest context among its workers."""
    out: dict[str, int] = {}
    for w in workers:
        name = display_name(str(w["model"]))
        n_ctx = int(w.get("n_ctx") or w.get("kv_capacity_tokens") or 0)
        out[name] = max(out.get(name, 0), n_ctx)
    return out


def model_object(name: str, context_length: int | None, status: str = READY) -> dict[str, Any]:
    """An OpenAI model object, with tandem's ``context_length`` and ``status``."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": name.split("/")[0] if "/" in name else "tandem",
        "context_length": context_length,
        "status": status,
    }


def model_list(workers: list[dict[str, Any]], aliases: tuple[str, ...]) -> list[dict[str, Any]]:
    """The ``data`` of ``GET /v1/models``: the served models and the aliases, by id.
    With no worker registered yet: the aliases, ``starting`` and without a context."""
    served = context_lengths(workers)
    if not served:
        return [model_object(n, None, STARTING) for n in sorted(set(aliases))]
    longest = max(served.values())
    named = {**{a: longest for a in aliases}, **served}
    return [model_object(n, named[n]) for n in sorted(named)]


def served_as(workers: list[dict[str, Any]], asked: str) -> str | None:
    """The model id ``asked`` names among the workers' models (its id, or the file
    name a worker reports), else None."""
    for w in workers:
        model = str(w["model"])
        if asked in (model, display_name(model)):
            return display_name(model)
    return None
