"""llama.cpp sequence state in host RAM: the prefix cache's host tier for llama.cpp.

``llama_state_seq_get_data`` copies one sequence's KV cells (and their positions)
out of the context into a buffer; ``llama_state_seq_set_data`` writes them into
another sequence, taking free cells of the unified pool. The state of a SmolLM2
sequence is ~23,050 bytes a token (its KV at f16 plus a small header); restoring
512 tokens took ~2 ms here where prefilling them took seconds.

The LlamaBackend calls these from its ``save`` / ``restore`` hooks; the pool of
sequence ids and the cells are the backend's.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llama_cpp as L

from tandem.workers.memory import llama_sequences as sequences  # noqa: F401 (llama.py's n_seq_max)

if TYPE_CHECKING:
    from tandem.workers.backends.llama import LlamaBackend

log = logging.getLogger(__name__)


@dataclass
class SeqState:
    """One saved sequence: its bytes and how many tokens they hold."""

    data: ctypes.Array[ctypes.c_uint8]
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return len(self.data)


def save(backend: LlamaBackend, seq: int) -> SeqState | None:
    """A host copy of sequence ``seq`` (None when llama.cpp cannot give one)."""
    size = L.llama_state_seq_get_size(backend.ctx, seq)
    if size <= 0:
        return None
    buf = (ctypes.c_uint8 * size)()
    if L.llama_state_seq_get_data(backend.ctx, buf, size, seq) != size:
        log.warning("llama.cpp saved less than the %d bytes of sequence %d", size, seq)
        return None
    return SeqState(buf, L.llama_memory_seq_pos_max(backend.mem, seq) + 1)


def restore(backend: LlamaBackend, state: SeqState) -> int | None:
    """A free sequence holding ``state`` again; None when no cells or id are free."""
    if not backend.free_seqs:
        return None
    seq = backend.free_seqs.pop()
    L.llama_memory_seq_rm(backend.mem, seq, -1, -1)
    if L.llama_state_seq_set_data(backend.ctx, state.data, state.nbytes, seq) != state.nbytes:
        L.llama_memory_seq_rm(backend.mem, seq, -1, -1)  # a partial write leaves nothing
        backend.free_seqs.append(seq)
        return None
    return seq
