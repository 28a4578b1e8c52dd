"""tandem: one language model served from CPU and GPU worker processes behind one router.

Everything installs under this one name: ``tandem.client`` (the library users
import), ``tandem.broker`` (the router process), ``tandem.workers`` (the worker
processes), ``tandem.cli`` (the ``tandem`` command), ``tandem.launcher`` (starts a
whole cluster), ``tandem.bench`` and ``tandem.common`` (protocol, sockets,
tokenizer). The folders of the checkout carry the same names without the prefix.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from tandem.client import AsyncClient, Client

try:
    __version__ = version("tandem-serve")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["AsyncClient", "Client", "__version__"]
