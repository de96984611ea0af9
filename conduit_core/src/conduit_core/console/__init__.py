"""The web console: server-rendered pages under ``/ui/`` on the daemon's own listener.

Why Jinja2 templates and htmx rather than a single-page app: the console ships inside
``conduit-core`` with no build step and no network at install (htmx is one vendored file), every
page is plain HTML a test can read, and each page and action calls the same service layer as the
HTTP API (``conduit_core.http.ApiService``), so the console holds no business logic of its own.
htmx only polls fragments to keep lists live; every action is a plain form ``POST``.

Authentication is the API token, exchanged at ``/ui/login`` for a session cookie (HttpOnly,
SameSite=Strict); every ``POST`` also needs the session's CSRF token. See ``docs/console.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from conduit_core.console._app import create_console
from conduit_core.console._pages import Schedules
from conduit_core.console._session import COOKIE, SESSION_SECONDS
from conduit_core.http import ApiService, LoginThrottle, RequestGuard, TokenSet

__all__ = ["COOKIE", "PREFIX", "SESSION_SECONDS", "create_console", "with_console"]

#: Every console path starts here; the rest of the listener is the bearer-token API.
PREFIX = "/ui"


def _always(_: object) -> bool:
    return True


def with_console(
    api: ASGIApp,
    service: ApiService,
    schedules: Schedules,
    token: str | TokenSet,
    *,
    max_body_bytes: Callable[[], int] | None = None,
    throttle: LoginThrottle | None = None,
) -> ASGIApp:
    """One ASGI app: ``/ui`` and ``/ui/…`` go to the console, everything else to ``api``.

    The API keeps its own bearer-token guard untouched; the console checks its session cookie
    itself (a browser cannot send a bearer header from a link), and gets the same request body
    limit as the API (``settings.http.max_body_bytes`` at start).
    """
    at_start = service.config.settings.http.max_body_bytes
    console = RequestGuard(
        create_console(service, schedules, token, throttle=throttle),
        authorized=_always,
        max_body=max_body_bytes or (lambda: at_start),
    )

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and (path == PREFIX or path.startswith(PREFIX + "/")):
            await console(scope, receive, send)
        elif scope["type"] == "http" and path == "/" and _browser(scope):
            await _to_console(send)
        else:
            await api(scope, receive, send)

    return dispatch


def _browser(scope: Scope) -> bool:
    """A browser opening the root: a ``GET`` that accepts HTML (an API client asks for JSON, or
    for anything, and keeps getting the API's JSON answer)."""
    if scope.get("method") not in ("GET", "HEAD"):
        return False
    accept = Headers(scope=scope).get("accept", "")
    return "text/html" in accept


async def _to_console(send: Send) -> None:
    await send({
        "type": "http.response.start",
        "status": 303,
        "headers": [(b"location", PREFIX.encode() + b"/"), (b"content-length", b"0"),
                    (b"cache-control", b"no-store")],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": b""})
