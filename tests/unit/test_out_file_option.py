"""``--out FILE`` of the benches and the twin: its folder is made, and found
writable, when the command starts, not when a long run ends and writes it."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from tandem.cli.main import main
from tandem.cli.options import out_file_option


@click.command()
@out_file_option()
def _writes(out: str | None) -> None:
    if out:
        Path(out).write_text("done\n")


def test_the_folder_is_made_before_the_command_runs(tmp_path: Path) -> None:
    target = tmp_path / "results" / "today" / "run.json"
    result = CliRunner().invoke(_writes, ["--out", str(target)])
    assert result.exit_code == 0, result.output
    assert target.read_text() == "done\n"


def test_a_folder_that_cannot_be_made_fails_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(_writes, ["--out", str(blocker / "sub" / "run.json")])
    assert result.exit_code == 2
    assert "cannot make the folder" in result.output
    assert not (blocker / "sub").exists()


def test_the_router_study_refuses_its_out_before_measuring(tmp_path: Path) -> None:
    # The study takes ~20 s a run; a bad --out used to fail only after it, losing it.
    from studies.router_overhead import main as router_study

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(router_study, ["--runs", "1", "--out", str(blocker / "r.json")])
    assert result.exit_code == 2
    assert "--out" in result.output and "run 1/1" not in result.output


def test_the_twin_robustness_suite_refuses_its_out_before_running(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = ["sim", "robustness", "--small", "--out", str(blocker / "r.md")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--out" in result.output and "cannot make the folder" in result.output
