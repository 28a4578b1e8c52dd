"""The wheel ships the product's rooms and nothing else: no study, no test, no deploy script.

Builds the real wheel (setuptools from the dev extra, no build isolation: nothing is
downloaded) and lists its files against the package's rooms as pyproject maps them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _rooms() -> dict[str, Path]:
    """{'tandem/broker/policies': ROOT/broker/policies, ...} from pyproject's mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config["package-dir"]
    rooms = {}
    for package in config["packages"]:
        top = next(k for k in sorted(dirs, key=len, reverse=True) if package.startswith(k))
        rest = package[len(top) :].lstrip(".").replace(".", "/")
        rooms[package.replace(".", "/")] = ROOT / dirs[top] / rest
    return rooms


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    # Built from a copy: setuptools leaves build/ and egg-info beside the sources.
    tree = tmp_path_factory.mktemp("tree") / "src"
    skip = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "docs", "tests")
    shutil.copytree(ROOT, tree, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps"]
    build += ["--no-build-isolation", "-q", "-w", str(out)]
    subprocess.run(build, check=True, capture_output=True, timeout=240)
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def test_every_file_of_the_wheel_is_a_module_of_a_room(wheel_files: set[str]) -> None:
    rooms = _rooms()
    for name in wheel_files:
        folder, _, _ = name.rpartition("/")
        assert folder in rooms, f"{name} is outside the package's rooms"


def test_the_wheel_holds_each_room_exactly(wheel_files: set[str]) -> None:
    for folder, source in _rooms().items():
        modules = {f"{folder}/{p.name}" for p in source.glob("*.py")}
        shipped = {n for n in wheel_files if n.rpartition("/")[0] == folder and n.endswith(".py")}
        assert shipped == modules, folder


def test_no_study_ships(wheel_files: set[str]) -> None:
    studies = {p.name for p in (ROOT / "studies").rglob("*.py")} - {"__init__.py"}
    assert studies, "studies/ holds the one-off measurements"
    # where the studies lived (a module of the same name elsewhere, workers/startup.py, is not one)
    labs = {
        n.rpartition("/")[2] for n in wheel_files if n.startswith(("tandem/bench/", "tandem/twin/"))
    }
    assert not studies & labs
    assert not any(n.startswith(("studies/", "tests/", "deploy/")) for n in wheel_files)
