"""Who serves, as the serve screen tells it: workers from other hosts as they attach
and leave (one that dies included), and the ``tandem join`` command for the next host.

Its own children the supervisor reports itself (started, registered, exited); this
watches the router's status for every other worker, so a remote worker's death, which
no local process sees, is said within a status poll (0.5 s) of the router noticing.
"""

from __future__ import annotations

import shlex
import socket
import time
from urllib.parse import urlsplit

import psutil

from tandem.launcher.joinservice import JoinService
from tandem.launcher.probes import Probes, registered
from tandem.launcher.screen import Screen

LISTEN_HINT = "this host only: serve --listen HOST (an address other hosts reach) lets them join"


class Fleet:
    def __init__(self, screen: Screen, local: set[str], expected: set[str],
                 service: JoinService | None = None) -> None:  # fmt: skip
        self.screen, self.local, self.service = screen, local, service
        self.waiting = set(expected)  # remote workers (ids or nodes) the config names
        self.seen: dict[str, str] = {}  # remote worker id -> its node
        self.address = shown_address(service.address) if service else ""
        self.next_expires_s = float("inf")  # when the token of the last "join" line expires

    def command(self, node: str | None = None) -> str:
        """``tandem join`` with a fresh one-time token (``node``: its --node)."""
        assert self.service is not None
        token = self.service.issue()
        if node is None:
            self.next_expires_s = time.monotonic() + self.service.tokens.ttl_s
        extra = ["--node", node] if node else []
        return shlex.join(["tandem", "join", self.address, "--token", token.text(), *extra])

    def rows(self) -> list[tuple[str, str]]:
        """The ready screen's rows about other hosts."""
        if self.service is None:
            return [("join", "other hosts: tandem serve --listen HOST prints the command")]
        out = [("join", f"on another host: {self.command()}")]
        if _loopback(self.address):
            out.append(("", LISTEN_HINT))
        out += [("expects", f"{w}: on its host: {self.command(w)}") for w in sorted(self.waiting)]
        return out

    def observe(self, probes: Probes) -> None:
        """Say who attached and who left since the last look, and who joined."""
        self._joins()
        rows = probes.workers()
        if rows is None:
            return
        for wid, row in rows.items():
            if wid in self.local or wid in self.seen:
                continue
            node = str(row.get("node") or "?")
            self.seen[wid] = node
            self.waiting -= {wid, node}
            self.screen.line("up", wid, f"(remote, node {node}) {registered(row)}")
        for wid in [w for w in self.seen if w not in rows]:
            node = self.seen.pop(wid)
            self.screen.line("down", wid, f"(remote, node {node}) left the router: stopped, "
                             "or its process or host died")  # fmt: skip

    def _joins(self) -> None:
        """A joined host, and the command for the next (the token it used is spent);
        a fresh one too when the last printed expires unused."""
        if self.service is None:
            return
        while not self.service.events.empty():
            node, words = self.service.events.get_nowait()
            self.screen.line("up", node, words)
            self.screen.line("info", "join", f"next host: {self.command()}")
        if time.monotonic() >= self.next_expires_s:
            self.screen.line("info", "join", f"the last token expired; next host: {self.command()}")

    def close(self) -> None:
        if self.service is not None:
            self.service.close()


def shown_address(bound: str) -> str:
    """The join address to print: as bound, or for a wildcard bind this host's first
    IPv4 address other than loopback (another of its addresses may be the one the
    other hosts reach), else its name."""
    parts = urlsplit(bound)
    host = parts.netloc.rsplit(":", 1)[0]
    if host not in ("0.0.0.0", "*", "[::]", "::"):
        return bound
    return f"tcp://{_this_host()}:{parts.port}"


def _this_host() -> str:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return socket.gethostname()


def _loopback(address: str) -> bool:
    host = urlsplit(address).hostname or ""
    return host.startswith("127.") or host in ("localhost", "::1")
