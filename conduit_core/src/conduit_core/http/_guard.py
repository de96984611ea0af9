"""The API's outermost layer: the bearer token first, then the request body limit.

It wraps the whole application, so an unknown route or method is answered only to a caller who
holds the token (everyone else gets 401, whatever the path), and no handler can read more than
``http.max_body_bytes`` of a body: a declared ``Content-Length`` over the limit is refused before
a byte is read, and a chunked body is counted while it streams, so an oversized body is never
buffered whole.

With named tokens (``[[tokens]]``) the token's :class:`Principal` is put in the request's
``state`` (``request.state.principal``) for the role checks and the ``actor`` of what it writes.
A client address that presented too many wrong tokens is refused with 429 and ``Retry-After``
before its token is even compared (:class:`LoginThrottle`); each wrong token is logged with the
address, never the token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conduit_core.errors import ConduitError
from conduit_core.http._schemas import ErrorBody
from conduit_core.http._tokens import LoginThrottle, Principal, TokenSet, client_address

__all__ = ["BodyTooLargeError", "RequestGuard", "bearer_check"]

log = logging.getLogger("conduit.http")

_ENCODER = msgspec.json.Encoder()


class BodyTooLargeError(ConduitError):
    """A request body over ``http.max_body_bytes`` (HTTP 413); nothing was read past the limit."""

    code = "too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"request body exceeds {limit} bytes (settings.http.max_body_bytes)", code=self.code
        )
        self.limit = limit


def bearer_check(token: str | TokenSet) -> Callable[[Headers], Any]:
    """The :class:`Principal` of a request's ``Authorization: Bearer <token>`` (falsy ``None``
    for a missing or wrong token); compared in constant time."""
    if isinstance(token, TokenSet):
        return token.from_headers
    expected = f"Bearer {token}".encode()

    def authorized(headers: Headers) -> bool:
        return hmac.compare_digest(headers.get("authorization", "").encode(), expected)

    return authorized


async def _answer(
    send: Send, status: int, message: str, code: str, *, retry_after: int | None = None
) -> None:
    body = _ENCODER.encode(ErrorBody(error=message, code=code))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: 401 before anything else, 413 for a body over ``max_body()`` bytes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authorized: Callable[[Headers], Any],
        max_body: Callable[[], int],
        throttle: LoginThrottle | None = None,
    ) -> None:
        self.app = app
        self.authorized = authorized
        self.max_body = max_body
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        address = client_address(scope)
        throttle = self.throttle
        wait = throttle.retry_after(address) if throttle is not None else None
        if wait is not None:
            await _answer(send, 429, f"too many wrong tokens from this address: try again in "
                          f"{wait} s", "login_throttled", retry_after=wait)  # fmt: skip
            return
        principal = self.authorized(headers)
        if not principal:
            if "authorization" in headers:  # a wrong token, not a missing one
                log.warning("API request refused: wrong bearer token from %s", address)
                if throttle is not None:
                    throttle.failed(address)
            await _answer(send, 401, "missing or wrong bearer token", "unauthorized")
            return
        if isinstance(principal, Principal):
            scope.setdefault("state", {})["principal"] = principal
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
