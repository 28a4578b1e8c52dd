"""CURVE authentication and encryption for both router sockets (docs/SECURITY.md).

A keys folder, made by ``tandem keys DIR`` and named by ``--keys DIR`` or
``TANDEM_KEYS`` on every process, holds::

    router.key            the router's public key: every worker and client needs it
    router.key_secret     the router's secret key: the router only
    worker.key_secret     a worker key pair (copy to worker hosts with router.key)
    client.key_secret     a client key pair
    workers/*.key         public keys the router accepts on its worker socket
    clients/*.key         public keys the router accepts on its client socket

With keys, the router's ZAP handler (pyzmq's ``zmq.auth``, common/zapgate.py) lets
a connection in only when its public key is in the folder for that socket, and
all traffic is encrypted; anyone else's handshake fails before a single frame
reaches the router. Without keys nothing is authenticated, and the router warns
when it listens on an address other hosts can reach. Keys or not, the same
handler caps the connections one peer address holds (common/peerlimit.py).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth

from tandem.common.peerlimit import PeerLimit
from tandem.common.settings import Addresses, env_str
from tandem.common.transport import Setup
from tandem.common.zapgate import close_domains, open_domains

log = logging.getLogger(__name__)

DOMAINS = ("workers", "clients")
ROLES = {"worker": "workers", "client": "clients"}
LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def keys_dir(given: str | None = None) -> Path | None:
    """The keys folder: ``given``, else TANDEM_KEYS, else None (no authentication)."""
    raw = given or env_str("KEYS", "")
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not (path / "router.key").is_file():
        raise ValueError(f"{path} is not a tandem keys folder (no router.key): run `tandem keys`")
    return path


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read key {path}: {exc}") from None


def peer_setup(keys: str | Path | None, role: str) -> Setup | None:
    """What a worker or client socket needs to reach a router that uses ``keys``."""
    folder = keys_dir(str(keys)) if keys else keys_dir()
    if folder is None:
        return None
    server_public, _ = _load(folder / "router.key")
    public, secret = _load(folder / f"{role}.key_secret")
    if secret is None:
        raise ValueError(f"{folder / f'{role}.key_secret'} holds no secret key")

    def setup(sock: zmq.Socket) -> None:
        sock.curve_serverkey = server_public
        sock.curve_publickey = public
        sock.curve_secretkey = secret

    return setup


def exposed(address: str) -> bool:
    """True when ``address`` can be reached from other hosts (tcp, not loopback)."""
    parts = urlsplit(address)
    if parts.scheme != "tcp":
        return False  # ipc:// and inproc:// stay on this host
    host = (parts.hostname or parts.netloc.rsplit(":", 1)[0]).lower()
    return not (host in LOOPBACK_HOSTS or host.startswith("127."))


def authorize(folder: Path, role: str, name: str, public: bytes, note: str = "") -> Path:
    """Accept the public key ``public`` (Z85) for ``role`` from the next handshake on:
    ``folder/<role's domain>/<name>.key``, written whole then renamed into place (the
    router never reads half a file). A public key is no secret: mode 0644."""
    if role not in ROLES or not name.isidentifier():
        raise ValueError(f"cannot authorize {role!r} key {name!r}")
    domain = folder / ROLES[role]
    domain.mkdir(exist_ok=True)
    return write_public_key(domain / f"{name}.key", public, note)


def write_public_key(path: Path, public: bytes, note: str = "") -> Path:
    """A public certificate file ``zmq.auth.load_certificate`` reads, written whole then
    renamed into place (a reader never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    comment = f"#   {note}\n" if note and note.isprintable() else ""
    tmp.write_text(f'#   tandem public key\n{comment}curve\n    public-key = "{public.decode()}"\n')
    tmp.replace(path)
    return path


@dataclass
class RouterGuard:
    """The router's side: CURVE server options per socket and the ZAP domains
    (common/zapgate.py) through which every new connection passes, keys or not: the
    cap on connections per peer address (``peers``), then the key check."""

    folder: Path | None = None
    domains: dict[str, str] = field(default_factory=dict)  # socket -> its ZAP domain
    peers: PeerLimit = field(default_factory=PeerLimit)

    @classmethod
    def start(
        cls, keys: str | None, addresses: Addresses, peers: PeerLimit | None = None
    ) -> RouterGuard:
        folder = keys_dir(keys)
        peers = peers if peers is not None else PeerLimit()
        if folder is None:
            for addr in (addresses.client, addresses.worker):
                if exposed(addr):
                    log.warning(
                        "listening on %s WITHOUT authentication: anyone who can reach it can "
                        "register as a worker (and receive prompts) or submit requests. Run "
                        "`tandem keys DIR` and pass --keys DIR (docs/SECURITY.md).",
                        addr,
                    )
        else:
            for domain in DOMAINS:
                (folder / domain).mkdir(exist_ok=True)
            log.info("CURVE authentication on: keys in %s", folder)
        return cls(folder, open_domains(DOMAINS, peers, folder), peers)

    def setup(self, domain: str) -> Setup:
        """The socket of ``domain`` (workers or clients): its ZAP domain and, with
        keys, the CURVE server options."""
        keys = _load(self.folder / "router.key_secret") if self.folder is not None else None
        zap = self.domains[domain].encode()

        def apply(sock: zmq.Socket) -> None:
            if keys is not None:
                sock.curve_server = True
                sock.curve_publickey, sock.curve_secretkey = keys
            sock.zap_domain = zap

        return apply

    def stop(self) -> None:
        if self.domains:
            close_domains(self.domains)
            self.domains = {}


def make_keys(folder: Path, force: bool = False) -> list[Path]:
    """Create a keys folder (router, one worker and one client key pair); the files made."""
    if (folder / "router.key").exists() and not force:
        raise ValueError(f"{folder} already holds keys (use --force to replace them)")
    folder.mkdir(parents=True, exist_ok=True)
    made = [Path(x) for x in zmq.auth.create_certificates(folder, "router")]
    made[1].chmod(0o600)
    for role in ROLES:
        made += add_key(folder, role, role)
    return made


def add_key(folder: Path, role: str, name: str) -> list[Path]:
    """One more key pair ``name`` for ``role`` (worker | client), accepted by the router."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {sorted(ROLES)}")
    if not name.isidentifier():
        raise ValueError("a key name must be letters, digits and _ only")
    public, secret = zmq.auth.create_certificates(folder, name)
    Path(secret).chmod(0o600)  # a secret key readable by others authenticates them too
    allowed = folder / ROLES[role]
    allowed.mkdir(exist_ok=True)
    shutil.copy(public, allowed / Path(public).name)
    return [Path(public), Path(secret), allowed / Path(public).name]
