"""OpenAI-style error responses: every 4xx/5xx body is
`{"error": {"message", "type", "param", "code"}}`, and the message names what was wrong.
Maps validation errors, engine refusals and unexpected exceptions; never swallows the last."""
from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tightfit.errors import TightfitError

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          503: "service_unavailable_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status,
                        headers=headers)


def describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    """One message naming every bad field (`max_tokens: Input should be ...`), and the first
    field as `param`. Union alternatives that failed are merged under their field."""
    problems: dict[str, list[str]] = {}
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            return f"the request body is not valid JSON: {detail}".rstrip(": "), None
        field = ".".join(str(x) for x in err.get("loc", ()) if not _is_tag(x))
        msgs = problems.setdefault(field or "body", [])
        if err.get("msg") not in msgs:
            msgs.append(str(err.get("msg", "invalid value")))
    parts = [f"{field}: {' | '.join(msgs)}" for field, msgs in problems.items()]
    param = next((f for f in problems if f != "body"), None)
    return "; ".join(parts) or "invalid request", param


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _is_tag(part: object) -> bool:
    """True for location parts that are not fields: "body", and pydantic's names of union
    alternatives (`str`, `list[int]`, `TextPart`, `function-after[...]`)."""
    if not isinstance(part, str):
        return False
    return part == "body" or part in _SCALAR_TAGS or "[" in part or "-" in part \
        or part[:1].isupper()


_FIELD = re.compile(r"^(\w+) ")
KNOWN_PARAMS = frozenset({"max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "n",
                          "prompt", "messages", "priority"})


def param_of(message: str) -> str | None:
    """The request field a TightfitError message starts with, if it names one."""
    m = _FIELD.match(message)
    if m and m.group(1) in KNOWN_PARAMS:
        return m.group(1)
    if message.startswith("stop strings"):
        return "stop"
    return None


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(TightfitError, _tightfit_error)
    app.add_exception_handler(Exception, _unexpected)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = describe_validation(exc)
    return error_response(400, message, param)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return error_response(exc.status_code, message, headers=dict(exc.headers or {}))


async def _tightfit_error(_: Request, exc: Exception) -> JSONResponse:
    return error_response(400, str(exc), param_of(str(exc)))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
