"""The Procfile (for honcho users) names commands and flags the CLI has: a renamed
flag fails here, not in a user's terminal."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tandem.cli.main import main

PROCFILE = Path(__file__).resolve().parents[2] / "Procfile"


def procfile_lines() -> list[tuple[str, list[str]]]:
    out = []
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            out.append((name.strip(), shlex.split(command)))
    return out


def test_the_procfile_runs_a_router_a_worker_and_a_gateway():
    commands = [argv[1] for _, argv in procfile_lines()]
    assert sorted(commands) == ["gateway", "router", "worker"]


@pytest.mark.parametrize(("name", "argv"), procfile_lines(), ids=lambda v: str(v)[:20])
def test_each_procfile_command_parses(name, argv):
    assert argv[0] == "tandem", name
    command = main.commands[argv[1]]
    command.make_context(argv[1], argv[2:])  # click raises on an unknown flag or value
