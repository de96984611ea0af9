"""The console's Starlette app: login, the session check, CSRF, and the route table.

Every page and action needs a session (a cookie got by presenting the API token at
``/ui/login``); without one a page redirects to the login form and an action answers 401.
Every state-changing request (``POST``) must also carry the session's CSRF token (form field
``csrf`` or header ``X-CSRF-Token``) and, when the browser sends an ``Origin``, come from this
console's own origin: a cross-site form or script is refused with 403 ``csrf_failed`` before
anything is read or changed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib.resources import files
from urllib.parse import parse_qs, urlsplit

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from conduit_core.console._actions import ConsoleActions, next_page
from conduit_core.console._pages import ConsolePages, Schedules
from conduit_core.console._render import SECURITY_HEADERS, page
from conduit_core.console._session import COOKIE, SESSION_SECONDS, Session, Sessions
from conduit_core.errors import ConduitError
from conduit_core.http import ApiService, LoginThrottle, TokenSet, client_address, status_for

__all__ = ["console_status", "create_console", "read_form", "refused"]

log = logging.getLogger("conduit.console")

#: The static files the console serves, with their media types (nothing else is served).
_STATIC = {
    "htmx.min.js": "text/javascript",
    "console.js": "text/javascript",
    "console.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
#: Form fields one request may carry (the largest form has nine, besides its picked rows).
_MAX_FIELDS = 20
#: Rows a bulk form may pick (the largest page); their ``ids`` values are kept, one per line.
_MAX_PICKED = 200

Handler = Callable[[Request, Session], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def read_form(raw: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the one encoding the console's forms use)."""
    try:
        text = raw.decode("utf-8")
        parsed = parse_qs(text, keep_blank_values=True, max_num_fields=_MAX_FIELDS + _MAX_PICKED)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConduitError(f"unreadable form: {exc}", code="invalid_body") from exc
    if len(parsed) > _MAX_FIELDS or len(parsed.get("ids", ())) > _MAX_PICKED:
        raise ConduitError("unreadable form: too many fields", code="invalid_body")
    form = {name: values[-1] for name, values in parsed.items()}
    if "ids" in parsed:
        form["ids"] = "\n".join(parsed["ids"])
    return form


def _same_origin(request: Request) -> bool:
    """Whether a browser says the request comes from this console's own pages.

    Browsers mark a cross-site request both ways: ``Sec-Fetch-Site`` (``cross-site``,
    ``same-site``) and an ``Origin`` that is not this host. A client that sends neither (curl, a
    script holding the session) is no browser being tricked, and still needs the CSRF token.
    """
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.netloc == request.headers.get("host", "") and parts.scheme == request.url.scheme


#: Codes only the console answers, with their status (the rest map as in the HTTP API).
_STATUS = {"csrf_failed": 403, "unauthorized": 401, "not_found": 404,
           "method_not_allowed": 405, "internal_error": 500, "forbidden_role": 403,
           "login_throttled": 429}  # fmt: skip


def console_status(exc: ConduitError) -> int:
    own = getattr(exc, "http_status", None)  # a schedule source's refusals carry their own
    if isinstance(own, int):
        return own
    return _STATUS.get(exc.code) or status_for(exc)


def refused(request: Request, exc: ConduitError, session: Session | None) -> Response:
    """The refusal as a page: its code and message, with the status the API would answer."""
    form: dict[str, str] = getattr(request.state, "form", {})
    return page(
        "error.html", status=console_status(exc), session=session, flashes=[], nav="",
        code=exc.code, message=exc.message, back=next_page(form, "/ui/"),
    )  # fmt: skip


def create_console(
    service: ApiService,
    schedules: Schedules,
    token: str | TokenSet,
    *,
    throttle: LoginThrottle | None = None,
) -> Starlette:
    """The console under ``/ui/`` over ``service`` (the API's service layer) and ``schedules``.

    ``token`` is the API token (or the named tokens) a login must present; ``throttle`` (the
    API's, shared) refuses an address after repeated wrong tokens. Mount it with
    :func:`conduit_core.console.with_console`.
    """
    sessions = Sessions(token)
    pages = ConsolePages(service, schedules)
    actions = ConsoleActions(service, schedules)

    def guarded(handler: Handler, *, writes: bool = False) -> Endpoint:
        async def serve(request: Request) -> Response:
            session = sessions.get(request.cookies.get(COOKIE))
            if session is None:
                if writes or request.headers.get("hx-request"):
                    err = ConduitError("log in first: no console session", code="unauthorized")
                    response = refused(request, err, None)
                    response.headers["HX-Redirect"] = "/ui/login"
                    return response
                return _redirect("/ui/login")
            try:
                if writes:
                    form = read_form(await request.body())
                    presented = form.get("csrf") or request.headers.get("x-csrf-token")
                    if not _same_origin(request) or not session.csrf_ok(presented):
                        raise ConduitError(
                            "missing or wrong CSRF token (reload the page and try again)",
                            code="csrf_failed",
                        )
                    request.state.form = form
                    if service.host.stopping:  # as the API: no new writes while stopping
                        raise ConduitError("the daemon is stopping", code="daemon_stopping")
                return await handler(request, session)
            except ConduitError as exc:
                if console_status(exc) >= 500 and exc.code != "daemon_stopping":
                    log.warning("%s %s failed: [%s] %s", request.method, request.url.path,
                                exc.code, exc)  # fmt: skip
                return refused(request, exc, session)

        return serve

    async def login_form(request: Request) -> Response:
        return page("login.html", session=None, flashes=[], nav="", error=None)

    async def login(request: Request) -> Response:
        if not _same_origin(request):
            err = ConduitError("login from another site refused", code="csrf_failed")
            return refused(request, err, None)
        address = client_address(request.scope)
        wait = throttle.retry_after(address) if throttle is not None else None
        if wait is not None:
            response = page("login.html", status=429, session=None, flashes=[], nav="",
                            error=f"too many wrong tokens from this address: try again in "
                            f"{wait} s")  # fmt: skip
            response.headers["Retry-After"] = str(wait)
            return response
        try:
            form = read_form(await request.body())
        except ConduitError as exc:
            return refused(request, exc, None)
        session = sessions.login(form.get("token", ""))
        if session is None:
            log.warning("console login refused: wrong token from %s", address)
            if throttle is not None:
                throttle.failed(address)
            return page("login.html", status=401, session=None, flashes=[], nav="",
                        error="wrong token (it is the daemon's API token file)")  # fmt: skip
        log.info("console login token=%s role=%s from %s", session.principal.name,
                 session.principal.role, address)  # fmt: skip
        response = _redirect("/ui/")
        response.set_cookie(
            COOKIE, session.id, max_age=SESSION_SECONDS, path="/ui", httponly=True,
            samesite="strict", secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def logout(request: Request, session: Session) -> Response:
        sessions.logout(session.id)
        response = _redirect("/ui/login")
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return refused(request, ConduitError(f"no static file {name!r}", code="not_found"),
                           None)  # fmt: skip
        body = files("conduit_core.console").joinpath("static", name).read_bytes()
        headers = dict(SECURITY_HEADERS, **{"Cache-Control": "max-age=3600"})
        return Response(body, media_type=_STATIC[name], headers=headers)

    async def root(request: Request) -> Response:
        return _redirect("/ui/")

    def get(path: str, handler: Handler) -> Route:
        return Route(path, guarded(handler), methods=["GET"])

    def post(path: str, handler: Handler) -> Route:
        return Route(path, guarded(handler, writes=True), methods=["POST"])

    routes = [
        Route("/ui", root, methods=["GET"]),
        Route("/ui/login", login_form, methods=["GET"]),
        Route("/ui/login", login, methods=["POST"]),
        Route("/ui/static/{name}", static, methods=["GET"]),
        post("/ui/logout", logout),
        get("/ui/", pages.needs_you),
        get("/ui/needs-you/list", pages.needs_you_list),
        get("/ui/needs-you/count", pages.needs_you_count),
        get("/ui/work", pages.work_list),
        get("/ui/work/rows", pages.work_rows),
        get("/ui/work/{id}", pages.work_detail),
        get("/ui/work/{id}/live", pages.work_live),
        get("/ui/work/{id}/artifacts/{attempt:int}/{name}", pages.artifact),
        get("/ui/work/{id}/history", pages.work_history),
        get("/ui/work/{id}/attempts/{attempt:int}/output/{stream}", pages.output),
        post("/ui/work/bulk", actions.work_bulk),
        post("/ui/work/{id}/{action}", actions.work_action),
        get("/ui/routines", pages.routines),
        get("/ui/routines/{id}", pages.routine),
        get("/ui/schedules", pages.schedules_page),
        post("/ui/schedules/{id:path}/{action}", actions.schedule_action),
        get("/ui/capacity", pages.capacity),
        get("/ui/capacity/live", pages.capacity_live),
    ]
    app = Starlette(routes=routes)

    async def not_found(request: Request, exc: Exception) -> Response:
        err = ConduitError(f"no console page {request.url.path}", code="not_found")
        return refused(request, err, sessions.get(request.cookies.get(COOKIE)))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        err = ConduitError(f"method {request.method} not allowed on {request.url.path}",
                           code="method_not_allowed")  # fmt: skip
        return refused(request, err, sessions.get(request.cookies.get(COOKIE)))

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("console: internal error on %s %s", request.method, request.url.path)
        err = ConduitError("internal error (see the daemon log)", code="internal_error")
        return refused(request, err, None)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    app.add_exception_handler(500, internal)
    return app


def _redirect(to: str) -> Response:
    return RedirectResponse(to, status_code=303, headers=SECURITY_HEADERS)
