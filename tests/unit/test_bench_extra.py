"""Plots and progress bars are the `bench` extra's: the client and the CLI import
without them, and a command that needs them says which extra to install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tandem.cli.extras import BENCH_MODULES

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, so nothing this test process imported counts."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_client_and_the_cli_import_without_plots_or_progress_bars() -> None:
    done = _python(
        "import sys, tandem, tandem.client, tandem.cli.main\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BENCH_MODULES!r}))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_they_are_the_bench_extra_not_the_install() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].split(";")[0].strip() for d in project["dependencies"]}
    bench = {d.split(">")[0].strip() for d in project["optional-dependencies"]["bench"]}
    assert not core & set(BENCH_MODULES)
    assert bench == set(BENCH_MODULES)


@pytest.mark.parametrize("command, sub", [("bench", "report"), ("sim", "validate")])
def test_a_bench_command_without_the_extra_names_it(command: str, sub: str) -> None:
    # A module set to None in sys.modules is one Python cannot import: as if not installed.
    done = _python(
        "import sys\n"
        f"for m in {BENCH_MODULES!r}: sys.modules[m] = None\n"
        "from tandem.cli.main import main\n"
        f"main([{command!r}, {sub!r}, 'missing.json'])"
    )
    assert done.returncode == 1, done.stderr
    assert f"tandem {command} needs matplotlib, tqdm, from the bench extra" in done.stderr
    assert "pip install 'tandem-serve[bench]'" in done.stderr


def test_with_the_extra_the_command_goes_on_to_its_own_checks() -> None:
    done = _python("from tandem.cli.main import main\nmain(['bench', 'report', 'missing.json'])")
    assert done.returncode == 2, done.stderr
    assert "does not exist" in done.stderr
    assert "extra" not in done.stderr
