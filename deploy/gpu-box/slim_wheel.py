"""Drop a llama-cpp-python wheel's second copy of its libraries, in place.

    python3 deploy/gpu-box/slim_wheel.py WHEEL

scikit-build-core packs what CMake installs: llama-cpp-python's own rules put the
libraries in llama_cpp/lib (where llama_cpp loads them from), and ggml's and llama's
rules put them again in the wheel's top-level lib/ and include/ (with CMake package
files). A CUDA build's libggml-cuda.so is tens of MB, so the copy decides whether the
wheel comes back from the box in one call. Entries under top-level lib/ and include/
are dropped from the archive and from RECORD, which pip checks.
"""

from __future__ import annotations

import os
import sys
import zipfile

DROP = ("lib/", "include/")


def slim(path: str) -> tuple[int, int]:
    """Rewrite ``path`` without DROP entries; returns (bytes before, bytes after)."""
    before, tmp = os.path.getsize(path), path + ".slim"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(DROP):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if not r.startswith(DROP)).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp, path)
    return before, os.path.getsize(path)


if __name__ == "__main__":
    a, b = slim(sys.argv[1])
    print(f"slim_wheel: {a / 1e6:.1f} MB -> {b / 1e6:.1f} MB")
