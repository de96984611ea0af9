"""The API's outermost layer: the bearer token first, then the request body limit.

It wraps the whole application, so an unknown route or method is answered only to a caller who
holds the token (everyone else gets 401, whatever the path), and no handler can read more than
``http.max_body_bytes`` of a body: a declared ``Content-Length`` over the limit is refused before
a byte is read, and a chunked body is counted while it streams, so an oversized body is never
buffered whole.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import msgspec
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conduit_core.errors import ConduitError
from conduit_core.http._schemas import ErrorBody

__all__ = ["BodyTooLargeError", "RequestGuard", "bearer_check"]

_ENCODER = msgspec.json.Encoder()


class BodyTooLargeError(ConduitError):
    """A request body over ``http.max_body_bytes`` (HTTP 413); nothing was read past the limit."""

    code = "too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"request body exceeds {limit} bytes (settings.http.max_body_bytes)", code=self.code
        )
        self.limit = limit


def bearer_check(token: str) -> Callable[[Headers], bool]:
    """Whether a request's headers carry ``Authorization: Bearer <token>`` (constant time)."""
    expected = f"Bearer {token}".encode()

    def authorized(headers: Headers) -> bool:
        return hmac.compare_digest(headers.get("authorization", "").encode(), expected)

    return authorized


async def _answer(send: Send, status: int, message: str, code: str) -> None:
    body = _ENCODER.encode(ErrorBody(error=message, code=code))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: 401 before anything else, 413 for a body over ``max_body()`` bytes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authorized: Callable[[Headers], bool],
        max_body: Callable[[], int],
    ) -> None:
        self.app = app
        self.authorized = authorized
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.authorized(headers):
            await _answer(send, 401, "missing or wrong bearer token", "unauthorized")
            return
        limit = self.max_body()
        declared = headers.get("content-length")
        # The server (h11) already refuses a malformed Content-Length with 400.
        if declared is not None and declared.isdigit() and int(declared) > limit:
            too_large = BodyTooLargeError(limit)
            await _answer(send, 413, too_large.message, too_large.code)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the handler's body read: it answers 413 like any coded error.
                    raise BodyTooLargeError(limit)
            return message

        await self.app(scope, limited, send)
