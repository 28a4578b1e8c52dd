"""llama.cpp's logits for a token sequence and their mean NLL: the reference that
MLX parity tests and the re-quantization report compare against."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def llama_logits(path: Path, ids: list[int], n_ctx: int = 512) -> np.ndarray:
    """Logits at every position of `ids`, one batch, 2 threads."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(path).encode(), llama_cpp.llama_model_default_params()
    )
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
    params.n_threads = params.n_threads_batch = 2
    ctx = llama_cpp.llama_init_from_model(model, params)
    batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
    try:
        for i, token in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(ids)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode failed on {len(ids)} tokens")
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), (len(ids), n_vocab))
        return logits.copy()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def mean_nll(logits: np.ndarray, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:] given each prefix."""
    x = logits[:-1].astype(np.float64)
    log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    return float(np.mean(log_z - x[np.arange(len(ids) - 1), ids[1:]]))
