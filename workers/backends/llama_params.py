"""llama.cpp's model and context settings per device, for ``LlamaBackend``.

One wheel serves both kinds of worker on a GPU box (two llama_cpp builds cannot be
installed side by side), so a CUDA or Metal build must be told to stay off the GPU:
a CPU worker names no offload device at all (llama.cpp otherwise puts its KV and, for
batches of 32+ tokens, its matrix products on the first GPU it finds, and the "CPU"
would be measured with the GPU's help). A GPU worker (``gpu`` or a ``gpu-*`` label,
as ``tandem serve`` names them) offloads every layer and its KV to one GPU, with
flash attention wherever llama.cpp's probe finds the device supports it for the model
(AUTO: a forced ENABLED would run an unsupported case anyway).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import llama_cpp as L

ALL_LAYERS = -1


def is_gpu(device: str) -> bool:
    return device == "gpu" or device.startswith("gpu-")


@dataclass(frozen=True)
class Placement:
    """Where a llama.cpp model and its context live: the few knobs that differ."""

    gpu: bool

    def model_params(self) -> tuple[Any, Any]:
        """The model params and an object that must stay alive until the model is
        loaded (the device list they point at)."""
        p = L.llama_model_default_params()
        if self.gpu:
            p.n_gpu_layers = ALL_LAYERS
            # One GPU per worker (the launcher picks it with CUDA_VISIBLE_DEVICES):
            # no layer split across whatever else is visible.
            p.split_mode = L.LLAMA_SPLIT_MODE_NONE
            p.main_gpu = 0
            return p, None
        p.n_gpu_layers = 0
        # An empty, NULL-terminated device list: no GPU device at all (NULL would
        # mean every device the build found).
        none = (ctypes.c_void_p * 1)(None)
        p.devices = ctypes.cast(none, ctypes.c_void_p)
        return p, none

    def tune_context(self, cparams: Any, step_tokens: int) -> None:
        """Set ``cparams`` for this device. One micro-batch per engine step (n_ubatch =
        n_batch = the step budget): a step is one graph, so more micro-batches would only
        add launches on a GPU and barriers on a CPU."""
        cparams.n_batch = cparams.n_ubatch = step_tokens
        if self.gpu:
            cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO
            cparams.offload_kqv = True  # the KV cache beside the layers, on the GPU
            cparams.op_offload = True
        else:
            cparams.op_offload = False  # no host op sent to a GPU, whatever the build


def placement(device: str) -> Placement:
    """The placement for a worker's device label; ValueError when it asks for a GPU
    this llama-cpp-python build cannot offload to."""
    gpu = is_gpu(device)
    if gpu and not L.llama_supports_gpu_offload():
        raise ValueError(
            f"--device {device}: this llama-cpp-python is a CPU-only build; a GPU worker "
            "needs a CUDA build (deploy/gpu-box/build_llama_cuda.sh) or macOS's Metal wheel"
        )
    return Placement(gpu)
