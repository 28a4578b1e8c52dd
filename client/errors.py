"""Typed errors raised by the client library, one per protocol error code."""

from __future__ import annotations

from tandem.common import protocol as p

HANDSHAKE_REFUSED = p.ErrorCode.HANDSHAKE_REFUSED  # client side only, like ROUTER_LOST
ROUTER_UNAVAILABLE = p.ErrorCode.ROUTER_UNAVAILABLE  # client side only: no router there


class TandemError(Exception):
    """A request failed; ``code`` is the protocol error code."""

    code: str = "error"  # an ErrorCode, or "timeout" / "error" (the library's own)

    def __init__(
        self,
        message: str,
        request_id: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.retry_after_s = retry_after_s  # set with Overloaded: when to try again
        if code:
            self.code = code


class BadRequest(TandemError):
    """The request itself is wrong; ``field``: the argument at fault, when the library
    found it before sending (client/checks.py)."""

    code = p.BAD_REQUEST

    def __init__(self, message: str, request_id: str | None = None, code: str | None = None,
                 retry_after_s: float | None = None, field: str | None = None) -> None:  # fmt: skip
        super().__init__(message, request_id, code, retry_after_s)
        self.field = field


class PromptTooLong(BadRequest):
    code = p.PROMPT_TOO_LONG


class VersionMismatch(TandemError):
    code = p.VERSION_MISMATCH


class NoWorkers(TandemError):
    code = p.NO_WORKERS


class WorkerLost(TandemError):
    code = p.WORKER_LOST


class Overloaded(TandemError):
    code = p.OVERLOADED


class RouterLost(TandemError):
    """The connection to the router closed mid-request (router stopped or restarted)."""

    code = p.ROUTER_LOST


class HandshakeRefused(RouterLost):
    """The router refused this client's handshake (its keys: docs/SECURITY.md). Every
    pending and later call on that client fails with it at once."""

    code = HANDSHAKE_REFUSED


class RouterUnavailable(RouterLost):
    """Nothing accepted a connection at the router's address while a call waited
    (``no_router_s``): no router runs there. The message names the address and how
    to start one. The call sent nothing that a router started later would run."""

    code = ROUTER_UNAVAILABLE


class RequestTimeout(TandemError, TimeoutError):
    code = "timeout"


_BY_CODE: dict[str, type[TandemError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        PromptTooLong,
        VersionMismatch,
        NoWorkers,
        WorkerLost,
        Overloaded,
        RouterLost,
        HandshakeRefused,
        RouterUnavailable,
    )
}
_BY_CODE[p.BAD_FRAME] = BadRequest
_BY_CODE[p.DUPLICATE_REQUEST] = BadRequest


def from_error(msg: p.Error) -> TandemError:
    cls = _BY_CODE.get(msg.code, TandemError)
    return cls(msg.message, msg.request_id, msg.code, msg.retry_after_s)
