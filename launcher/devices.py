"""What devices this machine has for workers: the CPU always, a GPU where MLX or a
GPU build of llama.cpp can use it.

Discovery is split in two so that tests can fake any machine: ``probe()`` reads
the real one into a ``Machine`` (facts only), ``devices(machine)`` is pure.
"""

from __future__ import annotations

import importlib.util
import platform
import shutil
import subprocess
from dataclasses import dataclass, field

from tandem.common.affinity import usable_cores


@dataclass(frozen=True)
class Machine:
    """Facts about a machine that decide its devices."""

    system: str  # platform.system(): Linux, Darwin, ...
    arch: str  # platform.machine(): x86_64, arm64, ...
    cores: int  # cores this process may use
    mlx_metal: bool = False  # mlx imports and has Metal
    mlx_cuda: bool = False  # mlx imports and has CUDA (mlx[cuda])
    llama_gpu: bool = False  # llama-cpp-python was built with GPU offload (CUDA or Metal)
    cuda_gpus: int = 0  # NVIDIA GPUs visible (nvidia-smi -L), 0 when unknown
    llama: bool = True  # llama-cpp-python is installed


@dataclass(frozen=True)
class Device:
    """One device a worker can serve from: its kind, the backend that drives it."""

    kind: str  # cpu | metal | cuda
    backend: str  # llama.cpp | mlx
    index: int = 0  # which GPU of its kind (CUDA_VISIBLE_DEVICES)
    cores: int = 0  # cpu: the cores it may use
    env: dict[str, str] = field(default_factory=dict)
    # Every backend installed here that can drive it, ``backend`` first: a GPU box
    # with MLX and a CUDA build of llama.cpp can run both engines on its GPU.
    engines: tuple[str, ...] = ()

    @property
    def gpu(self) -> bool:
        return self.kind != "cpu"

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}" if self.gpu else "cpu"


def devices(m: Machine) -> list[Device]:
    """The machine's devices, CPU first. Apple silicon: Metal through MLX, else through
    a Metal build of llama.cpp. NVIDIA: one device per GPU through MLX-CUDA, else
    through a CUDA build of llama.cpp."""
    cpu = "llama.cpp" if m.llama else "mlx"
    found = [Device("cpu", cpu, cores=m.cores, engines=(cpu,))]
    if m.system == "Darwin" and m.arch == "arm64":
        engines = _gpu_engines(m.mlx_metal, m.llama_gpu)
        if engines:
            found.append(Device("metal", engines[0], engines=engines))
        return found
    engines = _gpu_engines(m.mlx_cuda, m.llama_gpu and m.system == "Linux")
    if engines:
        for i in range(max(1, m.cuda_gpus)):
            # One GPU per worker: MLX and llama.cpp each use the first one they see.
            env = {"CUDA_VISIBLE_DEVICES": str(i)} if m.cuda_gpus > 1 else {}
            found.append(Device("cuda", engines[0], index=i, env=env, engines=engines))
    return found


def _gpu_engines(mlx: bool, llama: bool) -> tuple[str, ...]:
    """The backends that can drive a GPU, the default first (MLX, as before llama.cpp
    had a GPU worker; docs/results/h200/ measures which serves faster)."""
    return ("mlx",) * mlx + ("llama.cpp",) * llama


def hints(m: Machine) -> list[str]:
    """What the machine has that no installed backend can use, and what would."""
    out = []
    if m.cuda_gpus and not (m.mlx_cuda or m.llama_gpu):
        out.append(f"{m.cuda_gpus} NVIDIA GPU(s) found but no backend here can use them: "
                   "install the mlx-cuda extra (or a CUDA build of llama-cpp-python)")  # fmt: skip
    if m.system == "Darwin" and m.arch == "arm64" and not (m.mlx_metal or m.llama_gpu):
        out.append("Apple GPU unused: install the mlx-metal extra")
    if not m.llama:
        out.append("llama-cpp-python is not installed: the CPU is served by MLX (slow)")
    return out


def pick(found: list[Device], wanted: str) -> list[Device]:
    """The devices ``--devices`` names: auto (all), or a comma list of cpu, gpu (every
    GPU), metal, cuda, cuda:N. ValueError names what this machine has."""
    if wanted in ("", "auto", "all"):
        return found
    chosen: list[Device] = []
    for word in (w.strip() for w in wanted.split(",")):
        match = [d for d in found if word in (d.kind, d.label) or (word == "gpu" and d.gpu)]
        if not match:
            have = ", ".join(d.label for d in found)
            raise ValueError(f"--devices {word!r}: this machine has {have}")
        chosen += [d for d in match if d not in chosen]
    return chosen


def probe() -> Machine:
    """The real machine. Importing MLX takes a second or two, so it is imported only
    where a GPU could be behind it."""
    cores = usable_cores()
    system, arch = platform.system(), platform.machine()
    metal = cuda = False
    if importlib.util.find_spec("mlx") is not None:
        metal, cuda = _mlx_gpus()
    llama = importlib.util.find_spec("llama_cpp") is not None
    return Machine(
        system, arch, cores or 1, metal, cuda, llama and _llama_gpu(), _nvidia_gpus(), llama
    )


def _mlx_gpus() -> tuple[bool, bool]:
    try:
        import mlx.core as mx
    except Exception:  # a broken or CPU-less build: no MLX GPU
        return False, False
    metal = bool(getattr(mx, "metal", None) and mx.metal.is_available())
    cuda = bool(getattr(mx, "cuda", None) and mx.cuda.is_available())
    return metal, cuda


def _llama_gpu() -> bool:
    try:
        import llama_cpp
    except Exception:
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


def _nvidia_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())
