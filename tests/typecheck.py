"""Type-check the whole ``tandem`` package with mypy, laid out as the install lays it.

mypy cannot follow setuptools' editable install: the install maps ``tandem.broker``
onto broker/ through a finder on ``sys.meta_path``, which mypy never runs. Over the
checkout it finds tandem/ (the package root: ``__init__`` and ``__main__`` only) with
no rooms inside, and with missing imports ignored every type from another room was
silently ``Any``. So this links each room into ``.mypy_cache/tree/tandem/`` as
pyproject's package-dir maps it (the tree [tool.mypy] ``mypy_path`` names) and checks
the package there, incrementally (mypy's cache in .mypy_cache); its messages name the
checkout's files.

    .venv/bin/python -m tests.typecheck            # the whole package
    .venv/bin/python -m tests.typecheck FILE.py    # other targets, tandem.* resolved
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".mypy_cache" / "tree"


def link_tree() -> dict[Path, Path]:
    """(Re)make the linked package in TREE; returns {room link: checkout folder}."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    want: dict[Path, Path] = {}
    for name, folder in dirs["package-dir"].items():
        link = TREE.joinpath(*name.split("."))
        if name == "tandem":  # a real folder, so the rooms can be linked inside it
            want |= {link / f.name: f for f in (ROOT / folder).glob("*.py")}
        else:
            want[link] = ROOT / folder
    package = TREE / "tandem"
    package.mkdir(parents=True, exist_ok=True)
    for old in package.iterdir():  # a room or file the checkout no longer has
        if old not in want:
            old.unlink(missing_ok=True)
    for link, target in want.items():
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        # made aside and renamed over: two runs at once (two pytest sessions) both succeed
        new = link.with_name(f"{link.name}.{os.getpid()}")
        new.symlink_to(target, target_is_directory=target.is_dir())
        os.replace(new, link)
    return {link: target for link, target in want.items() if target.is_dir()}


@dataclass(frozen=True)
class Result:
    returncode: int
    text: str  # mypy's report, paths in the checkout


def run(*args: str) -> Result:
    """mypy over ``args`` (default: the package, as [tool.mypy] names it)."""
    rooms = link_tree()
    out = subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    # .mypy_cache/tree/tandem/broker/core.py -> broker/core.py, longest link first
    for link, folder in sorted(rooms.items(), key=lambda kv: -len(str(kv[0]))):
        text = text.replace(f"{link.relative_to(ROOT)}/", f"{folder.relative_to(ROOT)}/")
    text = text.replace(f"{(TREE / 'tandem').relative_to(ROOT)}/", "tandem/")
    return Result(out.returncode, text)


def main() -> int:
    result = run(*sys.argv[1:])
    print(result.text, end="")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
