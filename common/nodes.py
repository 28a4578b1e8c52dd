"""A worker's node: the machine it runs on, as ``tandem status``, ``top``, /metrics and
the serve screen name it (``--node``, ``TANDEM_NODE``; default the host's name).

A node name is a label anyone may set, so it is bounded and plain: 1 to 64 of
letters, digits and ``.``, ``-``, ``_`` (a host name, a Ray node id's 56 hex digits).
"""

from __future__ import annotations

import re
import socket

from tandem.common.settings import env_str

MAX_NODE_CHARS = 64
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def node_problem(name: str) -> str | None:
    """Why ``name`` is not a node name, or None."""
    if _NODE.fullmatch(name):
        return None
    return (f"node name {name[:80]!r} must be 1 to {MAX_NODE_CHARS} letters, digits, '.', '-' "
            "or '_', starting with a letter or digit")  # fmt: skip


def checked_node(name: str) -> str:
    """``name`` if it is a node name; ValueError saying why not."""
    problem = node_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def default_node() -> str:
    """TANDEM_NODE, else this host's name made a node name (its first label, other
    characters as ``-``, cut to the bound), else ``node``."""
    given = env_str("NODE", "")
    if given:
        return checked_node(given)
    host = socket.gethostname().split(".")[0]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", host).lstrip("._-")[:MAX_NODE_CHARS]
    return name or "node"
