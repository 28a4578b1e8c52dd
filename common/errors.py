"""Error codes and the one problem type every validator returns.

Kept apart from the protocol module so that the bounds checks the decoder runs
(``common/validation.py``) need nothing of the protocol's at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorCode(StrEnum):
    """Why a request or frame failed (``Error.code``; documented in docs/PROTOCOL.md)."""

    BAD_FRAME = "bad_frame"  # not msgpack / not a map / unknown type
    BAD_REQUEST = "bad_request"  # well-formed frame, invalid content
    VERSION_MISMATCH = "version_mismatch"
    PROMPT_TOO_LONG = "prompt_too_long"
    NO_WORKERS = "no_workers"
    DUPLICATE_REQUEST = "duplicate_request"
    WORKER_LOST = "worker_lost"
    WORKER_ERROR = "worker_error"  # the backend failed while running the request
    INTERNAL = "internal"  # the router hit a bug handling the request
    OVERLOADED = "overloaded"  # admission is full: retry after Error.retry_after_s
    ROUTER_LOST = "router_lost"  # client side: the connection to the router dropped
    HANDSHAKE_REFUSED = "handshake_refused"  # client side: the router refused our keys
    ROUTER_UNAVAILABLE = "router_unavailable"  # client side: no router at the address


@dataclass(frozen=True)
class Problem:
    """Why something cannot be accepted: an error code and a human message.

    Every validator returns ``Problem | None``; the receiver turns a Problem into
    an ``Error`` reply (or a log line when there is no one to reply to).
    """

    code: ErrorCode
    message: str
    field: str | None = None  # the path of the field at fault ("sampling.max_tokens")

    @classmethod
    def bad_request(cls, message: str, field: str | None = None) -> Problem:
        return cls(ErrorCode.BAD_REQUEST, message, field)
