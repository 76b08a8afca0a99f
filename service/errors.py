"""Errors as the OpenAI API gives them: a status code and ``{"error": {message, type, param, code}}``.

The ``openai`` package turns each status into its exception (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 409 ConflictError, 413 and others APIStatusError, 5xx
InternalServerError) and reads the body's fields into it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"


class ApiError(Exception):
    """One failed call; ``str()`` is its message."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = INVALID_REQUEST,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(kind: str, object_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No such {kind} object: {object_id}", param=param)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, kind="server_error", code="redis_unavailable")


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (no such route, method not allowed) in the OpenAI shape."""
    status = int(getattr(exc, "status_code", 500))
    detail = str(getattr(exc, "detail", "") or "error")
    if status == 404:
        detail = f"Invalid URL ({request.method} {request.url.path})"
    return ApiError(status, detail).response()
