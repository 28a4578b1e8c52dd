"""What the CLI prints (issue 38, item 6): `top --once` offers no key to quit (there
is nothing to quit), and `generate --stream` ends the streamed line before an error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from click.testing import CliRunner
from rich.console import Console

from tandem.cli.top import Rates, render
from tandem.cli.use import generate
from tandem.client import WorkerLost
from tandem.client.session import Delta
from tandem.common import protocol as p


def _text(live: bool) -> str:
    console = Console(record=True, width=200)
    console.print(render(p.StatusReply("lookahead", []), Rates(), "tcp://r:1", live=live))
    return console.export_text()


def test_only_the_live_view_says_how_to_quit():
    assert "(q quits)" in _text(live=True)
    once = _text(live=False)
    assert "tandem top" in once and "q quits" not in once


class _Streamed:
    """A stream that yields two deltas, then fails as a lost worker does."""

    def __iter__(self) -> Iterator[Delta]:
        yield Delta([1], "Hello")
        yield Delta([2], " wor")
        raise WorkerLost("worker cpu0 was lost", "r1")


class _Client:
    def __init__(self, *args: Any, **kw: Any) -> None:
        pass

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stream(self, **kw: Any) -> _Streamed:
        return _Streamed()


def test_a_streamed_answer_that_fails_ends_its_line_before_the_error(monkeypatch):
    monkeypatch.setattr("tandem.client.Client", _Client)
    result = CliRunner().invoke(generate, ["hi", "--stream", "--router", "tcp://127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.stdout == "Hello wor\n"  # the text as it came, and its line ended
    assert result.stderr == "error (worker_lost): worker cpu0 was lost\n"


def test_an_error_before_any_text_adds_no_blank_line(monkeypatch):
    class Empty(_Client):
        def stream(self, **kw: Any) -> Iterator[Delta]:
            raise WorkerLost("worker cpu0 was lost", "r1")

    monkeypatch.setattr("tandem.client.Client", Empty)
    result = CliRunner().invoke(generate, ["hi", "--stream", "--router", "tcp://127.0.0.1:1"])
    assert result.exit_code == 1 and result.stdout == ""
