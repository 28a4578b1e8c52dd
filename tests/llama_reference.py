"""A direct llama.cpp greedy loop, written independently of workers/, for parity tests."""

from __future__ import annotations

import ctypes

import llama_cpp as L


def greedy_reference(
    model_path: str,
    prompt: list[int],
    n_out: int,
    chunk: int,
    n_ctx: int = 8192,
    threads: int = 2,
    n_seq_max: int = 21,
) -> list[int]:
    """Prefill ``prompt`` in chunks of ``chunk`` tokens, then greedy-decode ``n_out`` tokens."""
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, chunk, chunk, n_seq_max
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    batch = L.llama_batch_init(chunk, 0, 1)

    def feed(tokens: list[int], start: int) -> None:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = int(i == len(tokens) - 1)
        batch.n_tokens = len(tokens)
        assert L.llama_decode(ctx, batch) == 0

    def argmax_last() -> int:
        logits = L.llama_get_logits_ith(ctx, -1)
        row = (ctypes.c_float * n_vocab).from_address(ctypes.addressof(logits.contents))
        return max(range(n_vocab), key=row.__getitem__)

    try:
        for s in range(0, len(prompt), chunk):
            feed(prompt[s : s + chunk], s)
        out = [argmax_last()]
        while len(out) < n_out and not L.llama_vocab_is_eog(vocab, out[-1]):
            feed([out[-1]], len(prompt) + len(out) - 1)
            out.append(argmax_last())
        return out
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
