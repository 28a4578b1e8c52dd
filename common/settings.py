"""The one place that reads ``TANDEM_*`` environment variables.

Command-line flags override these; library code never hard-codes an address.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_CLIENT_ADDR = "tcp://127.0.0.1:5555"
DEFAULT_WORKER_ADDR = "tcp://127.0.0.1:5556"
DEFAULT_JOIN_PORT = 5557  # tandem serve's join service (tandem join), on the worker host


@dataclass(frozen=True)
class Addresses:
    """Where the router listens: one socket for clients, one for workers."""

    client: str
    worker: str

    def __post_init__(self) -> None:
        for name, addr in (("client", self.client), ("worker", self.worker)):
            if "://" not in addr:
                raise ValueError(f"{name} address {addr!r} needs a scheme (tcp://, ipc://)")
        if self.client == self.worker:
            raise ValueError("client and worker addresses must differ")


def env_str(name: str, default: str) -> str:
    return os.environ.get(f"TANDEM_{name}", default)


def addresses() -> Addresses:
    """The router's addresses from TANDEM_CLIENT_ADDR / TANDEM_WORKER_ADDR."""
    return Addresses(
        client=env_str("CLIENT_ADDR", DEFAULT_CLIENT_ADDR),
        worker=env_str("WORKER_ADDR", DEFAULT_WORKER_ADDR),
    )
