"""How a client finds a fleet's router through Ray (``tandem status --ray``,
``tandem top --ray``): the router's actor hands over its client address, the
router's public key and the client key pair, which are written into a private
folder (0700, files 0600) that the caller removes when done."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tandem.fleet import NAMESPACE, need_ray
from tandem.fleet.keys import private_dir, remove

ACCESS_TIMEOUT_S = 30.0


class NoFleet(RuntimeError):
    """No tandem fleet answers on that Ray cluster."""


def router_access(address: str) -> tuple[str, Path, Callable[[], None]]:
    """(the router's client address, a keys folder for it, what removes that folder).
    Connects to Ray for the question unless this process already is connected."""
    ray = need_ray()
    ours = not ray.is_initialized()
    if ours:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING)  # fmt: skip
    try:
        try:
            host = ray.get_actor("router", namespace=NAMESPACE)
        except ValueError:
            raise NoFleet(f"no tandem fleet on the Ray cluster at {address!r} "
                          "(start one with tandem serve --ray)") from None  # fmt: skip
        where, keys = ray.get(host.access.remote(), timeout=ACCESS_TIMEOUT_S)
    finally:
        if ours:
            ray.shutdown()
    folder = private_dir("tandem-client-")
    keys.write(folder / "keys", ("client",))
    return where.client, folder / "keys", lambda: remove(folder)
