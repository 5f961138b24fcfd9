"""Pure-ASGI guards in front of every route: bearer-token access (constant-time comparison;
/health stays open) and a request-body size limit (413, checked on Content-Length and again on
the bytes actually received). They answer with the same OpenAI-style error bodies."""
from __future__ import annotations

import hmac
import json
from typing import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tightfit.server.errors import error_body

OPEN_PATHS = frozenset({"/health"})


async def send_error(send: Send, status: int, message: str, code: str | None = None,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class APIKeyMiddleware:
    """401 unless `Authorization: Bearer <key>` matches (compared with hmac.compare_digest)."""

    def __init__(self, app: ASGIApp, api_key: str,
                 on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"authorization") or b""
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if self.on_reject:
            self.on_reject("unauthorized")
        what = "invalid API key" if given else "missing API key"
        await send_error(send, 401, f"{what}: send the header 'Authorization: Bearer <key>' "
                         "with the key the server was started with", "invalid_api_key",
                         [(b"www-authenticate", b"Bearer")])


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`, whether declared (Content-Length) or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    def _message(self, size: int | None) -> str:
        got = f"{size} bytes" if size is not None else "more"
        return (f"request body too large: {got}, the limit is {self.max_bytes} bytes "
                "(server option --max-body-bytes)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if self.on_reject:
                self.on_reject("body_too_large")
            await send_error(send, 413, self._message(int(declared)), "body_too_large")
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if self.on_reject:
                        self.on_reject("body_too_large")
                    # FastAPI re-raises HTTPException from body reading; errors.py renders it.
                    raise HTTPException(413, self._message(None))
            return message

        return wrapped
