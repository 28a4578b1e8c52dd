"""What devices this machine has for workers: the CPU always, a GPU where MLX or a
GPU build of llama.cpp can use it.

Discovery is split in two so that tests can fake any machine: ``probe()`` reads
the real one into a ``Machine`` (facts only), ``devices(machine)`` is pure.
``probe()`` asks a short-lived child process: asking MLX or a CUDA build of
llama.cpp whether a GPU is there creates a CUDA context, which a serve supervisor
that did it itself held for its whole life (518 MiB of the H200's memory).
Which engine then drives each GPU is launcher/engines.py's choice.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from tandem.common.affinity import usable_cores

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0  # importing MLX and a CUDA llama.cpp: seconds; a first CUDA init more


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
    """The machine's devices, CPU first. Apple silicon: Metal through MLX or a Metal
    build of llama.cpp. NVIDIA: one device per GPU through a CUDA build of llama.cpp
    or MLX-CUDA. Each GPU's ``backend`` is the engine expected to serve fastest there
    before anything is measured (``_gpu_engines``); launcher/engines.py may replace it
    by what stored profiles measured, or by ``--engine``."""
    cpu = "llama.cpp" if m.llama else "mlx"
    found = [Device("cpu", cpu, cores=m.cores, engines=(cpu,))]
    if m.system == "Darwin" and m.arch == "arm64":
        engines = _gpu_engines(m.mlx_metal, m.llama_gpu, "metal")
        if engines:
            found.append(Device("metal", engines[0], engines=engines))
        return found
    engines = _gpu_engines(m.mlx_cuda, m.llama_gpu and m.system == "Linux", "cuda")
    if engines:
        for i in range(max(1, m.cuda_gpus)):
            # One GPU per worker: MLX and llama.cpp each use the first one they see.
            env = {"CUDA_VISIBLE_DEVICES": str(i)} if m.cuda_gpus > 1 else {}
            found.append(Device("cuda", engines[0], index=i, env=env, engines=engines))
    return found


# Which engine serves a GPU fastest before this machine has measured either, by kind:
# on an H200, llama.cpp's CUDA build decoded the embedded model 3-4x faster than
# MLX-CUDA (451-563 against 108-175 tok/s at batch 1; docs/results/h200/llama-cuda/),
# whose steps are bound by host-side launches; on Apple silicon nothing is measured
# here yet, so MLX stays first there, as it always was.
PRIOR = {"cuda": ("llama.cpp", "mlx"), "metal": ("mlx", "llama.cpp")}


def _gpu_engines(mlx: bool, llama: bool, kind: str) -> tuple[str, ...]:
    """The backends installed that can drive a GPU of ``kind``, in PRIOR's order."""
    have = {"mlx": mlx, "llama.cpp": llama}
    return tuple(e for e in PRIOR[kind] if have[e])


def hints(m: Machine) -> list[str]:
    """What the machine has that no installed backend can use, and what would."""
    out = []
    if m.cuda_gpus and not (m.mlx_cuda or m.llama_gpu):
        out.append(f"{m.cuda_gpus} NVIDIA GPU(s) found but no backend here can use them: "
                   "install the mlx-cuda extra (or a CUDA build of llama-cpp-python)")  # fmt: skip
    elif m.cuda_gpus and m.llama and not m.llama_gpu and m.system == "Linux":
        out.append("llama-cpp-python here is a CPU-only build: the GPU is served by MLX, "
                   "which decodes small models 3-4x slower; `bash deploy/setup.sh` builds "
                   "the CUDA one (minutes, once)")  # fmt: skip
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
    """The real machine, read by a child process (``python -m
    tandem.launcher.devices``) so that no GPU library is ever loaded into this one:
    it would keep a CUDA context for as long as this process lives. A child that
    fails leaves the GPUs out (logged), never the CPU."""
    cmd = [sys.executable, "-m", "tandem.launcher.devices"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        return Machine(**json.loads(out.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, TypeError, IndexError) as exc:
        log.warning("probing this machine's GPUs failed (%s): serving from the CPU", exc)
    llama = importlib.util.find_spec("llama_cpp") is not None
    return Machine(platform.system(), platform.machine(), usable_cores() or 1, llama=llama)


def probe_here() -> Machine:
    """The real machine, read in this process. Importing MLX takes a second or two, so
    it is imported only where a GPU could be behind it."""
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


if __name__ == "__main__":  # probe()'s child: the machine as one JSON line
    print(json.dumps(dataclasses.asdict(probe_here())))
