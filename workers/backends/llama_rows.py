"""Whether a CPU llama.cpp worker decodes a step's rows in one call or one at a time.

A batch of rows is one matrix product per weight, which on most devices costs little
more than one row. Not on every CPU: where the weights' type has no batched kernel
(Q4_1 on x86) or a tiled one poor at a few rows (Q8_0 there), two rows in one call cost
more than two calls of one. The 2-core development machine, 1 thread, 500-token
contexts: Q4_1 one row 9-10 ms, two rows in one call 20-22, four 35-39; Q8_0 10, 32,
49. A step that puts decode rows beside a prompt chunk pays too: a 256-token chunk
with three rows cost 1,230 ms against 1,089 + 31 in two calls (Q8_0: 671 against
543 + 27). So the backend times one row and two rows at its start (a fraction of a
second) and, where two rows in one call are slower than two calls, runs each row and
the step's prompt chunks as calls of their own. The step's tokens are the same; only
how they meet the kernels differs, and the step timer sees the whole step as before.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import llama_cpp as L

if TYPE_CHECKING:
    from tandem.workers.backends.llama import LlamaBackend

CONTEXT_TOKENS = 32  # each probe row's context: short, so the probe costs little
ROUNDS = 4  # the least of these per shape
SPLIT_ABOVE = 1.05  # two rows in one call must cost more than 2.1 single rows to split


def measure(backend: LlamaBackend) -> int | None:
    """1 where two rows in one call cost more than two single-row calls, else None."""
    if len(backend.free_seqs) < 2 or backend.batch_cap < CONTEXT_TOKENS * 2:
        return None
    seqs = [backend.free_seqs[-1], backend.free_seqs[-2]]
    try:
        n = 0
        for seq in seqs:
            for pos in range(CONTEXT_TOKENS):
                n = backend.put(n, 100 + pos, pos, seq, False)
        backend.decode_batch(n)
        pos = CONTEXT_TOKENS
        one, two = [], []
        for _ in range(ROUNDS):
            one.append(_timed(backend, [(seqs[0], pos)]))
            two.append(_timed(backend, [(seqs[0], pos + 1), (seqs[1], pos)]))
            pos += 2
            _timed(backend, [(seqs[1], pos - 1)])  # keeps both sequences level
        return 1 if min(two) > SPLIT_ABOVE * 2 * min(one) else None
    finally:
        for seq in seqs:
            L.llama_memory_seq_rm(backend.mem, seq, -1, -1)


def _timed(backend: LlamaBackend, rows: list[tuple[int, int]]) -> float:
    n = 0
    for seq, pos in rows:
        n = backend.put(n, 100, pos, seq, True)
    t0 = time.perf_counter()
    backend.decode_batch(n)
    return time.perf_counter() - t0
