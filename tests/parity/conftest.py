"""Fixtures the parity tests share: the llama.cpp backend on the embedded model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tandem.common.model_files import default_model_path


def _embedded_llama(module: Any) -> Any:
    """A llama.cpp backend on the embedded model (2 threads, 4 rows), shaped by the
    test module's LLAMA_BACKEND: its n_ctx, cache_entries and step_tokens."""
    from tandem.workers.backends.llama import LlamaBackend

    shape = getattr(module, "LLAMA_BACKEND", None)
    assert shape is not None, f"{module.__name__} names no LLAMA_BACKEND for its backend"
    return LlamaBackend(default_model_path(), threads=2, max_active=4, **shape)


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One backend a module's tests share, closed after the module."""
    b = _embedded_llama(request.module)
    yield b
    b.close()


@pytest.fixture(scope="module")
def fresh_backend(request: pytest.FixtureRequest) -> Callable[[], Any]:
    """Makes a new backend of the module's shape (its caller closes it)."""
    return lambda: _embedded_llama(request.module)
