"""Errors in OpenAI's shape (`{"error": {message, type, param, code}}`) with HTTP statuses.

Every failure the gateway answers goes through ApiError, so clients written for the
OpenAI API (the `openai` SDK raises one exception class per status) read them as usual.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tandem.client.errors import HANDSHAKE_REFUSED, ROUTER_UNAVAILABLE, TandemError
from tandem.common import protocol as p

# HTTP status and OpenAI error type for each tandem error code.
_BY_CODE: dict[str, tuple[int, str]] = {
    p.BAD_REQUEST: (400, "invalid_request_error"),
    p.BAD_FRAME: (400, "invalid_request_error"),
    p.DUPLICATE_REQUEST: (400, "invalid_request_error"),
    # OpenAI answers an oversize prompt with 400 and this code; tools look for it.
    p.PROMPT_TOO_LONG: (400, "invalid_request_error"),
    p.OVERLOADED: (429, "rate_limit_error"),
    p.NO_WORKERS: (503, "service_unavailable"),
    p.WORKER_LOST: (503, "service_unavailable"),
    # The router went away mid-request, or refuses this gateway's keys: not the
    # request's fault, and not a bug in the gateway.
    p.ROUTER_LOST: (503, "service_unavailable"),
    HANDSHAKE_REFUSED: (503, "service_unavailable"),
    ROUTER_UNAVAILABLE: (503, "service_unavailable"),  # no router runs at its address
    "timeout": (504, "timeout"),
}
_OPENAI_CODE: dict[str, str] = {p.PROMPT_TOO_LONG: "context_length_exceeded"}
log = logging.getLogger(__name__)


class ApiError(Exception):
    """An HTTP error answer: status, message, OpenAI error type, param and code."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    @classmethod
    def bad(cls, message: str, param: str | None = None) -> ApiError:
        """400: the request itself is wrong."""
        return cls(400, message, param=param)

    @classmethod
    def from_tandem(cls, exc: TandemError) -> ApiError:
        """The answer for a failure the router or a worker reported."""
        status, type_ = _BY_CODE.get(exc.code, (500, "server_error"))
        return cls(status, exc.message, type_, code=_OPENAI_CODE.get(exc.code, exc.code))

    @classmethod
    def internal(cls, message: str = "internal error") -> ApiError:
        return cls(500, message, "server_error", code="internal")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    # Starlette's own refusals (no such path, wrong method) in OpenAI's shape too.
    assert isinstance(exc, HTTPException)
    body = ApiError(exc.status_code, str(exc.detail)).body()
    return JSONResponse(body, exc.status_code)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("gateway failed on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(ApiError.internal(f"internal error: {exc}").body(), 500)


# Starlette's exception handlers: every failure answers in OpenAI's shape.
EXCEPTION_HANDLERS = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}
