"""A router address that can move: ``tandem worker --router-file PATH`` reads the
router's worker address from PATH and follows it when the file changes (the node
agents of ``tandem serve --ray`` write it when Ray restarts the router elsewhere),
so a worker re-points its connection in place instead of restarting."""

from __future__ import annotations

import os
from pathlib import Path

MAX_BYTES = 4096  # an address is one short line; anything longer is not one


def read_address(path: str | Path) -> str:
    """The address in ``path``: its first line, which must carry a scheme."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES).decode(errors="replace")
    except OSError as exc:
        raise ValueError(f"cannot read the router address from {path}: {exc}") from None
    addr = text.strip().splitlines()[0].strip() if text.strip() else ""
    if "://" not in addr:
        raise ValueError(f"{path} holds no router address (want e.g. tcp://HOST:PORT)")
    return addr


def write_address(path: Path, addr: str) -> None:
    """Replace ``path``'s address at once (a reader never sees half of it), 0600."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(addr + "\n")
    os.replace(tmp, path)


class RouterFile:
    """Tells when the address in a file changed; ``moved`` costs one stat."""

    def __init__(self, path: str | Path, current: str) -> None:
        self.path, self.current = Path(path), current
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def moved(self) -> str | None:
        """The new address when the file now names another one, else None (a file
        gone or unreadable meanwhile keeps the current address)."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            addr = read_address(self.path)
        except ValueError:
            return None
        if addr == self.current:
            return None
        self.current = addr
        return addr
