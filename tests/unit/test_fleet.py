"""The serve screen's view of other hosts (launcher/fleet.py): who attached, who left,
the join command printed, and the address shown for a wildcard bind."""

from __future__ import annotations

import io
import queue
import shlex
from typing import Any

from rich.console import Console

from tandem.launcher.fleet import Fleet, shown_address
from tandem.launcher.screen import Screen


class Rows:
    """Probes' stand-in: the router's worker rows, as the test sets them."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] | None = None

    def workers(self) -> dict[str, dict[str, Any]] | None:
        return self.rows


def screen() -> tuple[Screen, io.StringIO]:
    out = io.StringIO()
    return Screen(Console(file=out, width=200, highlight=False)), out


def row(node: str) -> dict[str, Any]:
    return {"node": node, "backend": "sim", "device": "cpu", "prefill_tok_s": 100.0,
            "decode_tok_s": [10.0]}  # fmt: skip


def test_remote_workers_are_said_once_as_they_attach_and_leave():
    s, out = screen()
    fleet = Fleet(s, local={"cpu0"}, expected={"far"})
    probes = Rows()
    fleet.observe(probes)  # the router not asked yet: nothing said
    probes.rows = {"cpu0": row("here"), "far-cpu0": row("far")}
    fleet.observe(probes)
    fleet.observe(probes)
    probes.rows = {"cpu0": row("here")}
    fleet.observe(probes)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "far-cpu0 (remote, node far) registered: sim on cpu" in lines[0]
    assert "far-cpu0 (remote, node far) left the router" in lines[1]
    assert fleet.waiting == set()  # far came: by its node


def test_without_a_join_service_the_screen_says_how_to_get_one():
    s, _ = screen()
    rows = Fleet(s, local=set(), expected=set()).rows()
    assert rows == [("join", "other hosts: tandem serve --listen HOST prints the command")]


class Service:
    """A join service's stand-in: an address and tokens."""

    class Tokens:
        ttl_s = 3600.0

    def __init__(self, address: str) -> None:
        self.address, self.tokens, self.n = address, self.Tokens(), 0
        self.events: queue.Queue[tuple[str, str]] = queue.Queue()

    def issue(self) -> Any:
        self.n += 1
        n = self.n

        class Token:
            def text(self) -> str:
                return f"tdj1.token{n}"

        return Token()

    def close(self) -> None:
        pass


def test_each_command_carries_a_token_of_its_own_and_loopback_is_flagged():
    s, out = screen()
    fleet = Fleet(s, local=set(), expected={"far"}, service=Service("tcp://127.0.0.1:5557"))
    rows = dict(fleet.rows())
    assert shlex.split(rows["join"].split(": ", 1)[1]) == [
        "tandem", "join", "tcp://127.0.0.1:5557", "--token", "tdj1.token1"]  # fmt: skip
    assert "--listen HOST" in rows[""]
    assert rows["expects"].endswith("--token tdj1.token2 --node far")
    fleet.service.events.put(("mac", "joined (cpu)"))  # type: ignore[union-attr]
    fleet.observe(Rows())
    assert "mac      joined (cpu)" in out.getvalue()
    assert "next host: tandem join tcp://127.0.0.1:5557 --token tdj1.token3" in out.getvalue()


def test_a_wildcard_bind_is_shown_as_an_address_of_this_host():
    assert shown_address("tcp://10.1.2.3:5557") == "tcp://10.1.2.3:5557"
    shown = shown_address("tcp://0.0.0.0:5557")
    assert shown.startswith("tcp://") and shown.endswith(":5557")
    assert "0.0.0.0" not in shown
