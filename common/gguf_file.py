"""A GGUF file's header read directly: key/values, tensor infos, a weights digest.

The `gguf` package's reader maps every array element to its own numpy view, so
opening a 128k-token vocabulary with 280k merges takes ~40 s on a small CPU;
reading the header sequentially takes well under a second. Only the header is
read here (no tensor data), except the few sampled bytes `weights_digest` hashes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9  # GGUFValueType codes that are not plain scalars
# GGUFValueType code -> format of one scalar value (struct and numpy read the same codes)
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
DIGEST_SAMPLE_BYTES = 4096  # hashed from the start, middle and end of every tensor


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GgufHeader:
    kv: dict[str, Any]
    types: dict[str, tuple[int, int | None]]  # key -> (value type, array item type)
    tensors: tuple[TensorInfo, ...]
    data_start: int  # file offset of the tensor data section
    file_size: int


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Parse `path`'s header; ValueError if it is not a GGUF file this reader knows."""
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is too old")
        kv: dict[str, Any] = {}
        types: dict[str, tuple[int, int | None]] = {}
        for _ in range(n_kv):
            key = _string(f)
            (vtype,) = struct.unpack("<I", f.read(4))
            kv[key], item_type = _value(f, vtype)
            types[key] = (vtype, item_type)
        tensors = tuple(_tensor_info(f) for _ in range(n_tensors))
        align = int(kv.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-f.tell() // align) * align
        size = f.seek(0, 2)
    return GgufHeader(kv, types, tensors, data_start, size)


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int) -> tuple[Any, int | None]:
    if vtype == STRING:
        return _string(f), None
    if vtype in _SCALARS:
        fmt = "<" + _SCALARS[vtype]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0], None
    if vtype != ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    item_type, n = struct.unpack("<IQ", f.read(12))
    if item_type == STRING:
        return [_string(f) for _ in range(n)], item_type
    if item_type in _SCALARS:
        dtype = np.dtype("<" + _SCALARS[item_type])
        return np.frombuffer(f.read(n * dtype.itemsize), dtype).tolist(), item_type
    raise ValueError(f"unsupported GGUF array of type {item_type}")


def _tensor_info(f: BinaryIO) -> TensorInfo:
    name = _string(f)
    (n_dims,) = struct.unpack("<I", f.read(4))
    shape = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
    ggml_type, offset = struct.unpack("<IQ", f.read(12))
    return TensorInfo(name, tuple(shape), ggml_type, offset)


def weights_digest(path: str | Path) -> str:
    """A short hex digest of a GGUF's weights: every tensor's name, type and shape,
    plus bytes sampled from its start, middle and end.

    Two files with the same digest hold the same tensors in the same quantization
    (metadata such as the name or chat template may differ). Reading ~12 KiB per
    tensor keeps it to milliseconds even for multi-GB files.
    """
    header = read_gguf_header(path)
    ends = sorted(t.offset for t in header.tensors) + [header.file_size - header.data_start]
    next_offset = dict(zip(ends, ends[1:], strict=False))
    h = hashlib.blake2b(digest_size=12)
    with open(path, "rb") as f:
        for t in sorted(header.tensors, key=lambda t: t.name):
            h.update(f"{t.name}|{t.ggml_type}|{t.shape}|".encode())
            start = header.data_start + t.offset
            size = next_offset[t.offset] - t.offset  # includes alignment padding: zeros
            for at in (0, max(0, size // 2 - DIGEST_SAMPLE_BYTES // 2), size - DIGEST_SAMPLE_BYTES):
                f.seek(start + max(0, at))
                h.update(f.read(min(DIGEST_SAMPLE_BYTES, size)))
    return h.hexdigest()
