"""A serving process's descriptor limit: raised to what the system allows.

Every client connection holds a descriptor: the gateway's HTTP connections, the
router's ZeroMQ peers (one TCP connection each, held by ZeroMQ's I/O thread). Linux
starts a process at a soft limit of 1,024 under a hard limit that is usually far
higher, so a few hundred streaming clients plus a slow-client flood would run a
process out of descriptors long before it ran out of anything else. Raising the soft
limit to the hard one needs no privilege; the processes that accept connections do
it at start and size their own caps from the result.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

CEILING = 1 << 20  # taken when the hard limit is unlimited (Linux's default nr_open)
DARWIN_OPEN_MAX = 10240  # macOS's per-process cap, whatever getrlimit says


def raise_fd_limit() -> int | None:
    """Raise this process's soft descriptor limit to its hard limit (at most
    ``CEILING``). Returns the soft limit in force afterwards, None where the platform
    has none. A refusal leaves the limit as it was, and is logged."""
    if sys.platform == "win32":  # no such limit to raise
        return None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return CEILING if soft == resource.RLIM_INFINITY else soft
    # macOS reports an unlimited hard limit and refuses more than OPEN_MAX: try that next.
    tries = [want, *([DARWIN_OPEN_MAX] if soft < DARWIN_OPEN_MAX < want else [])]
    error: Exception | None = None
    for target in tries:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError) as exc:
            error = exc
    log.warning("descriptor limit stays at %d (raising it to %d: %s)", soft, want, error)
    return soft
