"""The fleet's CURVE keys: made once by ``tandem serve --ray``, carried to every
actor through Ray (its constructor arguments, held by Ray's control store), and
written on each node only into a private folder (0700, files 0600) that the
node's own subprocesses read with ``--keys`` / ``TANDEM_KEYS``."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq

BANNER = "#   tandem fleet key: made by tandem serve --ray, carried through Ray\n"


@dataclass(frozen=True)
class KeyPair:
    public: str  # Z85 text, as zmq.curve_keypair gives it
    secret: str

    @classmethod
    def new(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public.decode(), secret.decode())


@dataclass(frozen=True)
class FleetKeys:
    """The router's pair, one pair every worker uses, one every client uses."""

    router: KeyPair
    worker: KeyPair
    client: KeyPair

    @classmethod
    def new(cls) -> FleetKeys:
        return cls(KeyPair.new(), KeyPair.new(), KeyPair.new())

    def write(self, folder: Path, roles: tuple[str, ...]) -> Path:
        """A keys folder (common/auth.py's layout) holding the secrets of ``roles``
        (router | worker | client) only, and the public keys the router accepts."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
        _cert(folder / "router.key", self.router.public, None)
        for role in roles:
            pair: KeyPair = getattr(self, role)
            _cert(folder / f"{role}.key_secret", pair.public, pair.secret)
        if "router" in roles:
            for domain, pair in (("workers", self.worker), ("clients", self.client)):
                (folder / domain).mkdir(mode=0o700, exist_ok=True)
                _cert(folder / domain / f"fleet-{domain}.key", pair.public, None)
        return folder


def private_dir(prefix: str) -> Path:
    """A new folder only this user can read (mkdtemp makes it 0700), in memory where
    the system has /dev/shm (nothing secret reaches a disk). Folders an earlier
    process of this prefix left behind (it was killed) are removed first."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    for old in base.glob(f"{prefix}pid*-*"):
        pid = old.name.removeprefix(f"{prefix}pid").partition("-")[0]
        if pid.isdigit() and not _running(int(pid)) and old.stat().st_uid == os.getuid():
            remove(old)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}pid{os.getpid()}-", dir=base))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _cert(path: Path, public: str, secret: str | None) -> None:
    body = f'{BANNER}metadata\ncurve\n    public-key = "{public}"\n'
    if secret is not None:
        body += f'    secret-key = "{secret}"\n'
    # Created 0600 before a byte is written: a secret is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
