"""A plain (non-editable) wheel holds the whole package: imported from outside the
checkout, it starts a sim cluster from its bundled profile and answers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import tandem
    from tandem.launcher.cluster import Cluster, WorkerSpec

    assert tandem.__file__.startswith(sys.argv[1]), tandem.__file__
    spec = WorkerSpec("sim0", ["--backend", "sim", "--profile", "gpu-m2", "--max-active", "2"])
    with Cluster(workers=[spec]) as cluster, cluster.client(timeout_s=60) as client:
        result = client.generate("Hello", max_tokens=4, ignore_eos=True)
    assert result.worker == "sim0" and result.stats["output_tokens"] == 4, result
    print("answered", tandem.__version__)
    """
)


def test_wheel_installed_outside_the_checkout_serves(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("tandem_serve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tandem/workers/backends/profiles/gpu-m2.json" in names
    assert not any(n.split("/")[0] in {"broker", "workers", "client", "common"} for n in names)
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    # The wheel's copy comes first on the path, ahead of the checkout's editable install;
    # the run starts in an empty folder so nothing of the checkout can shadow it.
    env = {**os.environ, "PYTHONPATH": str(site)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(site)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "answered" in out.stdout
