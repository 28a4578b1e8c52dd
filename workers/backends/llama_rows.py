"""How a CPU llama.cpp worker's steps meet the kernels: a step's decode rows in one call
or one at a time, and the smallest prompt chunk worth a call.

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

Prompt chunks have a floor of their own: a tiled matrix product wastes most of a tile
on a few rows. Q8_0 there, a 512-token prompt in chunks of 8, 16, 32, 64, 128 and 256
tokens: 5.1, 3.0, 3.0, 2.1, 2.0, 1.9 ms a token. A step's time budget (the engine's
``step_budget_x``) that cut chunks to 34 tokens beside four decode rows served a
conc-4 load at 47 tok/s against 50-51 with a floor of 64-128. So the probe also
times chunks of 32, 64 and 128 tokens, and the smallest whose cost a token is within
``CHUNK_SLACK`` of the 128's is the floor (``min_chunk_tokens``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

import llama_cpp as L

from tandem.common.gguf_file import weights_digest
from tandem.common.model_files import cache_root
from tandem.workers.backends.llama_weights import machine

if TYPE_CHECKING:
    from tandem.workers.backends.llama import LlamaBackend

log = logging.getLogger(__name__)

CONTEXT_TOKENS = 32  # each probe row's context: short, so the probe costs little
ROUNDS = 4  # the least of these per shape
SPLIT_ABOVE = 1.05  # two rows in one call must cost more than 2.1 single rows to split
CHUNKS = (32, 64, 128)  # prompt chunk sizes probed (224 tokens: 0.5 s at Q8_0 here)
CHUNK_SLACK = 1.2  # a floor chunk may cost this much more a token than a 128-token one


def probed(backend: LlamaBackend) -> tuple[int | None, int]:
    """``measure``, remembered per weights file, thread count and machine beside the
    weights' own record (llama_weights.py): a worker's later starts skip the probe
    (0.5-1.5 s on 2 cores). Only a full probe is kept."""
    folder = cache_root() / "weights"
    record = folder / f"{weights_digest(backend.model_path)}.t{backend.threads}.kernels.json"
    try:
        doc = json.loads(record.read_text())
        if doc.get("machine") == machine():
            rows = doc["rows_per_call"]
            return (None if rows is None else int(rows)), int(doc["min_chunk_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rows, floor = measure(backend)
    if backend.batch_cap >= max(CHUNKS) and _room(backend):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            doc = {"rows_per_call": rows, "min_chunk_tokens": floor, "machine": machine()}
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(record)
        except OSError as exc:  # a read-only cache: probe again next time
            log.warning("cannot keep the kernel probe's result: %s", exc)
    return rows, floor


def _room(backend: LlamaBackend) -> bool:
    """Cells for the chunk probe, and as many more."""
    return backend.n_ctx >= 2 * (max(CHUNKS) + sum(CHUNKS))


def measure(backend: LlamaBackend) -> tuple[int | None, int]:
    """(rows a decode call carries: 1 where two rows in one call cost more than two
    single-row calls, else None for all; the smallest efficient prompt chunk, 1 for
    no floor)."""
    if len(backend.free_seqs) < 2:
        return None, 1
    rows = _rows_per_call(backend) if backend.batch_cap >= 2 * CONTEXT_TOKENS else None
    floor = _chunk_floor(backend) if backend.batch_cap >= max(CHUNKS) and _room(backend) else 1
    return rows, floor


def _chunk_floor(backend: LlamaBackend) -> int:
    seq = backend.free_seqs[-1]
    per_token: dict[int, float] = {}
    try:
        pos = 0
        for k in (max(CHUNKS), *CHUNKS):  # the first gives the rest a context to attend
            per_token[k] = _timed(backend, [(seq, pos + i, False) for i in range(k)]) / k
            pos += k
    finally:
        L.llama_memory_seq_rm(backend.mem, seq, -1, -1)
    return floor_of(per_token)


def floor_of(per_token: dict[int, float]) -> int:
    """The smallest chunk costing within ``CHUNK_SLACK`` a token of the largest's; 1
    (no floor) when the smallest probed already does."""
    best = per_token[max(per_token)]
    floor = min(k for k in per_token if per_token[k] <= CHUNK_SLACK * best)
    return 1 if floor == min(per_token) else floor


def _rows_per_call(backend: LlamaBackend) -> int | None:
    seqs = [backend.free_seqs[-1], backend.free_seqs[-2]]
    try:
        _timed(backend, [(seq, pos, False) for seq in seqs for pos in range(CONTEXT_TOKENS)])
        pos = CONTEXT_TOKENS
        one, two = [], []
        for _ in range(ROUNDS):
            one.append(_timed(backend, [(seqs[0], pos, True)]))
            two.append(_timed(backend, [(seqs[0], pos + 1, True), (seqs[1], pos, True)]))
            pos += 2
            _timed(backend, [(seqs[1], pos - 1, True)])  # keeps both sequences level
        return 1 if min(two) > SPLIT_ABOVE * 2 * min(one) else None
    finally:
        for seq in seqs:
            L.llama_memory_seq_rm(backend.mem, seq, -1, -1)


def _timed(backend: LlamaBackend, cells: list[tuple[int, int, bool]]) -> float:
    """Seconds of one call of these (sequence, position, logits) cells."""
    n = 0
    for seq, pos, logits in cells:
        n = backend.put(n, 100 + pos % 1000, pos, seq, logits)
    t0 = time.perf_counter()
    backend.decode_batch(n)
    return time.perf_counter() - t0
