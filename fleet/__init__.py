"""tandem on a Ray cluster (``tandem serve --ray``): Ray places, supervises and
restarts the processes; the data plane stays ZeroMQ with CURVE (docs/DEPLOY.md).

Ray is imported lazily (``need_ray``), so the rest of tandem works without it.
"""

from __future__ import annotations

from typing import Any

RAY_SERIES = "2.60."  # the extra pins it (pyproject.toml): the actor APIs used here
NAMESPACE = "tandem"  # Ray namespace of the fleet's named actors


class RayMissing(RuntimeError):
    """Ray is not installed here: the ``ray`` extra is needed."""


def need_ray() -> Any:
    """The ``ray`` module, or RayMissing saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissing(
            "tandem serve --ray needs Ray: pip install 'tandem-serve[ray]' (Ray 2.60) on "
            "every node of the cluster"
        ) from None
    return ray
