"""The MLX worker's batched decode KV cache (its samplers: workers/backends/mlx/sampling.py).

All decoding requests share one cache per layer, shaped (rows, kv_heads, columns,
head_dim), with rows *right-aligned*: row b holds its tokens in columns
``[pad[b], idx)``. A decode step then writes every row at column ``idx`` with one
slice update per layer (no scatter, no concatenation), and attention masks the
left padding. This is the layout of mlx-lm's ``BatchKVCache``; it is re-done here
because that class syncs the device on every filter/extract (``.tolist()``),
extracts up to its write index (which would include a speculative token) and
cannot roll a step back. Paddings live in Python, so rows join and leave without
waiting for the device.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

KV = tuple[mx.array, mx.array]  # one layer's (keys, values), shaped (1, heads, n, dim)


class LayerKV:
    """One layer's view of a ``DecodeBatch``, as mlx-lm's attention layers call it."""

    step = 256  # columns are added in steps, as mlx-lm's KVCache does, to amortize copies

    def __init__(self, batch: DecodeBatch, keys: mx.array, values: mx.array) -> None:
        self.batch = batch
        self.keys = keys
        self.values = values
        self.offset: mx.array | int = 0  # per-row positions, set by the batch each step

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> KV:
        start = self.batch.idx
        end = start + keys.shape[2]
        if end > self.keys.shape[2]:
            grow = -(-(end - self.keys.shape[2]) // self.step) * self.step
            self.keys = _pad_columns(self.keys, 0, grow)
            self.values = _pad_columns(self.values, 0, grow)
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values
        return self.keys[..., :end, :], self.values[..., :end, :]

    def make_mask(self, n: int, **_: Any) -> mx.array | str | None:
        return self.batch.mask(n)


class DecodeBatch:
    """The KV of every request that is decoding, one row each, right-aligned.

    ``rows`` are opaque owners (the backend's slots); a row's length is
    ``idx - pad``. ``add``/``remove`` copy the cache once per membership change;
    ``forward`` runs one token per row through the model.

    A batch whose rows differ in length needs an attention mask, and on CUDA MLX's
    fused decode attention takes none: the step falls back to unfused attention
    (its cost: docs/results/h200/matrix-warm2/README.md, "Ragged batches").
    ``additive_mask`` gives the mask as 0 / -inf in the cache's dtype instead of
    booleans; ``always_mask`` masks even an unpadded batch — both only for that
    measurement (studies/step_gap.py).
    """

    additive_mask = False
    always_mask = False

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.pads: list[int] = []
        self.idx = 0  # the next column every row writes
        self.layers: list[LayerKV] = []
        self._pad_array: mx.array | None = None  # None while no row is padded

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, owner: Any, kv: list[KV], n_tokens: int) -> None:
        """Append a row holding the first ``n_tokens`` columns of ``kv`` (per layer)."""
        if not self.rows:
            room = -(-max(n_tokens, 1) // LayerKV.step) * LayerKV.step - n_tokens
            self.layers = [
                LayerKV(self, _pad_columns(k[..., :n_tokens, :], 0, room),
                        _pad_columns(v[..., :n_tokens, :], 0, room))
                for k, v in kv
            ]  # fmt: skip
            self.rows, self.pads, self.idx = [owner], [0], n_tokens
            self._pads_changed()
            return
        shift = max(0, n_tokens - self.idx)  # a longer newcomer pushes every row right
        if shift:
            for layer in self.layers:
                layer.keys = _pad_columns(layer.keys, shift, 0)
                layer.values = _pad_columns(layer.values, shift, 0)
            self.pads = [p + shift for p in self.pads]
            self.idx += shift
        left = self.idx - n_tokens
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            right = layer.keys.shape[2] - self.idx
            layer.keys = mx.concatenate(
                [layer.keys, _pad_columns(k[..., :n_tokens, :], left, right)]
            )
            layer.values = mx.concatenate(
                [layer.values, _pad_columns(v[..., :n_tokens, :], left, right)]
            )
        self.rows.append(owner)
        self.pads.append(left)
        self._pads_changed()

    def remove(self, owner: Any) -> int:
        """Drop ``owner``'s row; returns the index it had (to filter per-row arrays)."""
        b = self.rows.index(owner)
        del self.rows[b], self.pads[b]
        if not self.rows:
            self.layers, self.pads, self.idx = [], [], 0
            self._pads_changed()
            return b
        keep = mx.array([i for i in range(len(self.rows) + 1) if i != b])
        trim = min(self.pads)  # columns no remaining row uses
        for layer in self.layers:
            layer.keys = mx.take(layer.keys, keep, axis=0)[..., trim:, :]
            layer.values = mx.take(layer.values, keep, axis=0)[..., trim:, :]
        self.pads = [p - trim for p in self.pads]
        self.idx -= trim
        self._pads_changed()
        return b

    def extract(self, owner: Any, n_tokens: int) -> list[KV]:
        """Copies of the first ``n_tokens`` of ``owner``'s KV (they outlive the batch)."""
        b = self.rows.index(owner)
        lo = self.pads[b]
        return [
            (
                mx.contiguous(layer.keys[b : b + 1, :, lo : lo + n_tokens]),
                mx.contiguous(layer.values[b : b + 1, :, lo : lo + n_tokens]),
            )
            for layer in self.layers
        ]

    def rollback(self) -> None:
        """Forget the last column of every row (an unused speculative step)."""
        self.idx -= 1

    def forward(self, model: Any, tokens: mx.array) -> mx.array:
        """Feed ``tokens[b]`` to row b; returns the logits, shaped (rows, vocab)."""
        positions = mx.array([self.idx - p for p in self.pads])
        for layer in self.layers:
            layer.offset = positions
        logits = model(tokens[:, None], cache=self.layers)
        self.idx += 1
        return logits[:, -1, :]

    def mask(self, n: int) -> mx.array | str | None:
        """The attention mask for ``n`` new columns (mlx-lm's conventions)."""
        if self._pad_array is None:
            return None if n == 1 else "causal"
        cols = mx.arange(self.idx + n)
        causal = mx.arange(self.idx, self.idx + n)[:, None] >= cols[None]
        keep = causal[None, None] & (cols >= self._pad_array[:, None, None, None])
        if not self.additive_mask:
            return keep
        dtype = self.layers[0].keys.dtype
        return mx.where(keep, mx.array(0, dtype), mx.array(-mx.inf, dtype))

    def _pads_changed(self) -> None:
        masked = any(self.pads) or (self.always_mask and self.pads)
        self._pad_array = mx.array(self.pads) if masked else None


def _pad_columns(x: mx.array, left: int, right: int) -> mx.array:
    if left == 0 and right == 0:
        return x
    return mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)])
