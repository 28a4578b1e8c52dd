"""llama.cpp as a GPU worker: discovery on injected machines (a Mac with only
llama.cpp's Metal wheel, a CUDA box with both engines), what `tandem serve` starts
there, and the model/context settings each device label gets. The GPU settings are
checked against llama-cpp-python's own structs with the build's offload support
faked, so they run wherever llama-cpp-python is installed (no GPU needed)."""

from __future__ import annotations

import ctypes

import pytest

from tandem.launcher import devices as dev
from tandem.workers.config import WorkerConfig
from tests.unit.test_serve_plan import dry_run, flag

L = pytest.importorskip("llama_cpp")
from tandem.workers.backends import llama_params  # noqa: E402 - needs llama_cpp

MAC_LLAMA = dev.Machine("Darwin", "arm64", cores=10, llama_gpu=True)
MAC_BOTH = dev.Machine("Darwin", "arm64", cores=10, mlx_metal=True, llama_gpu=True)
CUDA_BOTH = dev.Machine("Linux", "x86_64", cores=16, mlx_cuda=True, llama_gpu=True, cuda_gpus=1)


def test_a_mac_with_only_llama_cpp_serves_metal_through_it(monkeypatch):
    found = dev.devices(MAC_LLAMA)
    assert [(d.kind, d.backend, d.engines) for d in found] == [
        ("cpu", "llama.cpp", ("llama.cpp",)),
        ("metal", "llama.cpp", ("llama.cpp",)),
    ]
    procs = dry_run(monkeypatch, MAC_LLAMA)
    assert flag(procs["gpu0"], "--backend") == "llama.cpp"
    assert flag(procs["gpu0"], "--device") == "gpu-metal"
    assert flag(procs["gpu0"], "--max-active") == "16"
    assert "--threads" not in procs["gpu0"]  # a GPU worker's threads are not the CPU's


def test_both_engines_on_one_gpu_are_reported_in_the_measured_order():
    # Apple silicon: nothing measured here, MLX first as before; CUDA: llama.cpp's
    # build decoded 3-4x faster than MLX on the H200 (launcher/devices.py PRIOR).
    assert dev.devices(MAC_BOTH)[1].engines == ("mlx", "llama.cpp")
    cuda = dev.devices(CUDA_BOTH)[1]
    assert (cuda.kind, cuda.backend, cuda.engines) == ("cuda", "llama.cpp", ("llama.cpp", "mlx"))
    # A Linux box never offers Metal, whatever its llama.cpp build says.
    assert [d.kind for d in dev.devices(dev.Machine("Linux", "aarch64", 4, llama_gpu=True))] == [
        "cpu",
        "cuda",
    ]


@pytest.mark.parametrize("label", ["gpu", "gpu-metal", "gpu-cuda"])
def test_a_gpu_label_measures_quickly_and_offloads_everything(monkeypatch, label):
    cfg = WorkerConfig(router="tcp://127.0.0.1:1", backend="llama.cpp", device=label)
    # Its kernels come compiled in the build (no first-shape compilation to pay for
    # before serving): a stored profile prices it at once, else a quick measurement.
    assert cfg.measurement(label, told=True) == "none"
    assert cfg.measurement(label, told=False) == "quick"
    monkeypatch.setattr(llama_params.L, "llama_supports_gpu_offload", lambda: True)
    place = llama_params.placement(label)
    mparams, keep = place.model_params()
    assert mparams.n_gpu_layers == -1 and keep is None
    assert mparams.split_mode == L.LLAMA_SPLIT_MODE_NONE and mparams.devices is None
    cparams = L.llama_context_default_params()
    place.tune_context(cparams, 512)
    assert (cparams.n_batch, cparams.n_ubatch) == (512, 512)
    assert cparams.flash_attn_type == L.LLAMA_FLASH_ATTN_TYPE_AUTO
    assert cparams.offload_kqv and cparams.op_offload


@pytest.mark.parametrize("label", ["cpu", "cpu-anything"])
def test_a_cpu_worker_names_no_gpu_even_in_a_gpu_build(monkeypatch, label):
    monkeypatch.setattr(llama_params.L, "llama_supports_gpu_offload", lambda: True)
    place = llama_params.placement(label)
    mparams, keep = place.model_params()
    assert mparams.n_gpu_layers == 0
    # devices points at a list whose first entry is the terminator: no device at all.
    assert mparams.devices is not None
    assert ctypes.cast(mparams.devices, ctypes.POINTER(ctypes.c_void_p))[0] is None
    assert keep is not None  # the list outlives the load
    cparams = L.llama_context_default_params()
    place.tune_context(cparams, 256)
    assert not cparams.op_offload and cparams.n_ubatch == 256


def test_a_gpu_label_on_a_cpu_only_build_is_refused_naming_the_cuda_build(monkeypatch):
    monkeypatch.setattr(llama_params.L, "llama_supports_gpu_offload", lambda: False)
    with pytest.raises(ValueError, match="CPU-only build.*build_llama_cuda.sh"):
        llama_params.placement("gpu")
    assert llama_params.placement("cpu").gpu is False
