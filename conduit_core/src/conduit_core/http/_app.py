"""The Starlette application: bearer-token auth, msgspec bodies, ``{error, code}`` errors.

One route table (:data:`ROUTES`) drives both the handlers and the OpenAPI document, so the
document cannot drift from what is served.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from conduit_core.errors import STORE_OUTAGE_CODES, ConduitError, LeaseLostError, StoreError
from conduit_core.http._approvals import APPROVAL_HANDLERS, APPROVAL_ROUTES
from conduit_core.http._bulk import BULK_HANDLERS, BULK_ROUTES
from conduit_core.http._daemons import DAEMON_HANDLERS, DAEMON_ROUTES
from conduit_core.http._guard import RequestGuard, bearer_check
from conduit_core.http._history import HistoryPage
from conduit_core.http._output import OutputTail, check_stream, check_tail
from conduit_core.http._schemas import (
    BatchSubmitRequest,
    BatchSubmitResult,
    CancelRequest,
    CapacityView,
    ConfirmStoppedRequest,
    ErrorBody,
    EventView,
    Health,
    InputRequest,
    InterruptRequest,
    RetryRequest,
    SubmitRequest,
    WorkDetail,
    WorkPage,
)
from conduit_core.http._search import SEARCH_QUERY, WorkFilter
from conduit_core.http._service import ApiService
from conduit_core.http._tokens import (
    LoginThrottle,
    TokenSet,
    actor_of,
    principal_of,
    require,
)
from conduit_core.validation import MAX_DEPTH, TooDeepError, check_json_depth

__all__ = [
    "PAGE_LIMIT",
    "ROUTES",
    "ApiRoute",
    "allowed_methods",
    "create_app",
    "decode_body",
    "page_limit",
    "route_role",
    "status_for",
]

log = logging.getLogger("conduit.http")

#: The request is well formed but does not fit the config (a binding, a scope, a key template).
_UNPROCESSABLE = frozenset({
    "unknown_binding", "unknown_scope", "unknown_executor", "over_cap",
    "concurrency_key_field_missing", "invalid_concurrency_key", "dependency_unknown",
    "dependency_cycle",
})  # fmt: skip
_UNAVAILABLE = frozenset({"store_unreachable", "store_unavailable", "daemon_stopping"})
#: The caller's own request is wrong (its shape, a number, an id, its nesting).
_BAD_REQUEST = frozenset(
    {
        "invalid_json", "invalid_body", "invalid_query", "too_deep", "invalid_id",
        "invalid_name", "invalid_number", "invalid_value", "invalid_text", "too_many_items",
        "invalid_status", "invalid_time", "invalid_cursor", "invalid_filter", "invalid_bulk",
        "invalid_duration", "invalid_key", "invalid_key_template", "key_field_missing",
        "dedup_and_debounce", "dedup_without_key",
    }
)  # fmt: skip
#: The page sizes ``limit`` may ask for; outside them a request is refused, not clamped.
PAGE_LIMIT = (1, 500)


def status_for(exc: ConduitError) -> int:
    """The HTTP status of an error, by its stable code."""
    if isinstance(exc, LookupError) and exc.code == "not_found":
        return 404
    if exc.code in _UNPROCESSABLE:
        return 422
    if isinstance(exc, StoreError) or exc.code in _UNAVAILABLE:
        return 503
    if exc.code in _BAD_REQUEST:
        return 400
    if exc.code == "too_large":
        return 413
    if exc.code == "unauthorized":
        return 401
    if exc.code == "forbidden_role":
        return 403
    if exc.code == "login_throttled":
        return 429
    if isinstance(exc, LeaseLostError):
        return 409
    return 409


@dataclass(frozen=True)
class ApiRoute:
    """One operation: what it takes and answers (the OpenAPI document is made from these)."""

    method: str
    path: str
    summary: str
    #: The success body's type (a Struct, or ``list[...]``); ``None`` for an empty answer.
    response: Any
    status: int = 200
    body: type[msgspec.Struct] | None = None
    #: ``(name, type, description)``; an ``int`` parameter named ``limit`` is a page size, a
    #: ``Literal`` of strings an enum.
    query: tuple[tuple[str, Any, str], ...] = ()
    #: Further success statuses with the same body (``PATCH /v1/schedules/{id}`` runs with 202).
    also: tuple[int, ...] = ()
    #: The least token role that may call it (docs/http.md); unset: ``viewer`` for ``GET``,
    #: ``operator`` for every other method.
    role: str | None = None


#: Operations only an ``admin`` token may call (the rest: ``GET`` viewer, else operator).
ADMIN_ROUTES = frozenset(
    {
        ("POST", "/v1/work/{id}/confirm-stopped"),
        ("POST", "/v1/schedules"),
        ("DELETE", "/v1/schedules/{id}"),
        ("POST", "/v1/daemon/drain"),
    }
)


def route_role(route: ApiRoute) -> str:
    """The least role that may call ``route``."""
    if route.role is not None:
        return route.role
    if (route.method, route.path) in ADMIN_ROUTES:
        return "admin"
    return "viewer" if route.method in ("GET", "HEAD") else "operator"


ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute(
        "POST", "/v1/work", "Create Work with its first input (200: deduplicated, not created)",
        WorkDetail, 201, SubmitRequest, also=(200,),
    ),
    ApiRoute(
        "POST",
        "/v1/work/batch",
        "Create many Work in one request; each item is created or refused on its own",
        BatchSubmitResult,
        200,
        BatchSubmitRequest,
    ),
    # Before the ``/v1/work/{id}/…`` templates, which ``/v1/work/bulk/cancel`` also matches.
    *(ApiRoute(*route) for route in BULK_ROUTES),
    ApiRoute(
        "GET",
        "/v1/work",
        "Search Work, newest first by default (keyset pages on created time and id)",
        WorkPage,
        query=SEARCH_QUERY,
    ),
    ApiRoute("GET", "/v1/work/{id}", "Work with attempts, segments, holds, waiting", WorkDetail),
    ApiRoute("POST", "/v1/work/{id}/input", "Send an input event", EventView, 202, InputRequest),
    ApiRoute(
        "POST",
        "/v1/work/{id}/inject",
        "Deliver input to the running attempt",
        EventView,
        202,
        InputRequest,
    ),
    ApiRoute("POST", "/v1/work/{id}/cancel", "Cancel Work", WorkDetail, 200, CancelRequest),
    ApiRoute("POST", "/v1/work/{id}/retry", "Manual retry", WorkDetail, 200, RetryRequest),
    ApiRoute(
        "POST",
        "/v1/work/{id}/interrupt",
        "Interrupt the running attempt",
        WorkDetail,
        202,
        InterruptRequest,
    ),
    ApiRoute(
        "POST",
        "/v1/work/{id}/confirm-stopped",
        "Confirm that the held attempt no longer runs (for its epoch; audited)",
        WorkDetail,
        200,
        ConfirmStoppedRequest,
    ),
    ApiRoute(
        "GET",
        "/v1/work/{id}/history",
        "What happened to the Work: inputs, holds, gate decisions, attempts, controls, who, when",
        HistoryPage,
        query=(
            ("order", Literal["oldest", "newest"], "`oldest` (default) or `newest` first"),
            ("limit", int, "page size (1-500, default 100)"),
            ("after", str, "the previous page's `next`"),
        ),
    ),
    ApiRoute(
        "GET",
        "/v1/work/{id}/attempts/{attempt}/output",
        "The tail of an attempt's stdout or stderr (running or ended), as its executor keeps it",
        OutputTail,
        query=(
            ("stream", Literal["stdout", "stderr"], "`stdout` (default) or `stderr`"),
            ("tail", int, "bytes from the end (1-1048576, default 65536)"),
        ),
    ),
    ApiRoute("GET", "/v1/capacity", "Capacity per pool and scope", CapacityView),
    ApiRoute("GET", "/v1/health", "Daemon and store health", Health),
    # Held Work: needs-you, approve/refuse (human gate), release (budget); see _approvals.
    *(ApiRoute(*route) for route in APPROVAL_ROUTES),
    # The daemons on the store, and drain (see _daemons).
    *(ApiRoute(*route) for route in DAEMON_ROUTES),
)

_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[type[msgspec.Struct], msgspec.json.Decoder[Any]] = {
    route.body: msgspec.json.Decoder(route.body) for route in ROUTES if route.body is not None
}


def _json(body: Any, status: int = 200) -> Response:
    return Response(_ENCODER.encode(body), status_code=status, media_type="application/json")


def _error(message: str, code: str, status: int) -> Response:
    return _json(ErrorBody(error=message, code=code), status)


def decode_body(decoder: msgspec.json.Decoder[Any], raw: bytes) -> Any:
    """A request body as its Struct (empty = ``{}``), or a coded 400 naming the field."""
    raw = raw.strip() or b"{}"
    try:
        value = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ConduitError(f"invalid request body: {exc}", code="invalid_body") from exc
    except msgspec.DecodeError as exc:
        raise ConduitError(f"malformed JSON: {exc}", code="invalid_json") from exc
    except RecursionError:
        # msgspec's decoder gives up at the interpreter's recursion limit (~1,000 levels).
        raise TooDeepError("$", f"nested deeper than {MAX_DEPTH} levels") from None
    # Shallower than that still can be too deep to store and read back (the store decodes on a
    # deeper stack): the one depth limit of every document applies, read from the text.
    check_json_depth(raw, "$", MAX_DEPTH)
    return value


def _decode(body_type: type[msgspec.Struct], raw: bytes) -> Any:
    return decode_body(_DECODERS[body_type], raw)


def page_limit(raw: str) -> int:
    """The ``limit`` query parameter: an integer in :data:`PAGE_LIMIT`, else a coded 400."""
    low, high = PAGE_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = None
    if limit is None or not low <= limit <= high:
        raise ConduitError(
            f"query parameter 'limit' must be an integer from {low} to {high}, not {raw!r}",
            code="invalid_query",
        )
    return limit


def _query(request: Request) -> dict[str, Any]:
    params = request.query_params
    out: dict[str, Any] = {
        "filters": WorkFilter.from_query(params, also=("limit", "after")),
        "after": params.get("after") or None,
    }
    if "limit" in params:
        out["limit"] = page_limit(params["limit"])
    return out


Handler = Callable[[ApiService, Request, Any], Awaitable[msgspec.Struct]]


async def _submit(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.submit(body, actor=actor_of(request))


async def _submit_batch(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.submit_batch(body, actor=actor_of(request))


async def _list(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.list_work(**_query(request))


async def _show(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.show(request.path_params["id"])


def _only(request: Request, *names: str) -> None:
    unknown = sorted(set(request.query_params) - set(names))
    if unknown:
        raise ConduitError(f"unknown query parameter {unknown[0]!r}", code="invalid_query")


async def _history(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    params = request.query_params
    _only(request, "order", "limit", "after")
    order = params.get("order", "oldest")
    if order not in ("oldest", "newest"):
        raise ConduitError(f"query parameter 'order': {order!r} is not oldest or newest",
                           code="invalid_query")  # fmt: skip
    limit = page_limit(params["limit"]) if "limit" in params else 100
    return await svc.history(request.path_params["id"], limit=limit, after=params.get("after"),
                             newest=order == "newest")  # fmt: skip


async def _output(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    params = request.query_params
    _only(request, "stream", "tail")
    raw = request.path_params["attempt"]
    if not raw.isdigit():
        raise ConduitError(f"attempt {raw!r} is not an attempt number", code="invalid_query")
    stream = check_stream(params.get("stream", "stdout"))
    return await svc.output(request.path_params["id"], int(raw), stream,
                            check_tail(params.get("tail")))  # fmt: skip


async def _input(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.send_input(request.path_params["id"], body, actor=actor_of(request))


async def _inject(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.inject(request.path_params["id"], body, actor=actor_of(request))


async def _cancel(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.cancel(request.path_params["id"], body, actor=actor_of(request))


async def _retry(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.retry(request.path_params["id"], body, actor=actor_of(request))


async def _interrupt(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.interrupt(request.path_params["id"], body, actor=actor_of(request))


async def _confirm_stopped(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.confirm_stopped(request.path_params["id"], body, actor=actor_of(request))


async def _capacity(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.capacity()


async def _health(svc: ApiService, request: Request, body: Any) -> msgspec.Struct:
    return await svc.health()


_HANDLERS: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/work"): _submit,
    ("POST", "/v1/work/batch"): _submit_batch,
    ("GET", "/v1/work"): _list,
    ("GET", "/v1/work/{id}"): _show,
    ("POST", "/v1/work/{id}/input"): _input,
    ("POST", "/v1/work/{id}/inject"): _inject,
    ("POST", "/v1/work/{id}/cancel"): _cancel,
    ("POST", "/v1/work/{id}/retry"): _retry,
    ("POST", "/v1/work/{id}/interrupt"): _interrupt,
    ("POST", "/v1/work/{id}/confirm-stopped"): _confirm_stopped,
    ("GET", "/v1/work/{id}/history"): _history,
    ("GET", "/v1/work/{id}/attempts/{attempt}/output"): _output,
    ("GET", "/v1/capacity"): _capacity,
    ("GET", "/v1/health"): _health,
    **APPROVAL_HANDLERS,
    **BULK_HANDLERS,
    **DAEMON_HANDLERS,
}


def allowed_methods(app: Starlette, scope: Any) -> list[str]:
    """Every method some route serves at this request's path (the ``Allow`` of a 405). A
    literal path shadows the templates it also matches, as OpenAPI matches paths:
    ``/v1/work/batch`` is the bulk submit (POST only), never ``GET /v1/work/{id}``."""
    literal: set[str] = set()
    templated: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods and route.matches(scope)[0] != Match.NONE:
            (templated if route.param_convertors else literal).update(route.methods)
    return sorted(literal or templated)


def create_app(
    service: ApiService,
    token: str | TokenSet,
    *,
    max_body_bytes: Callable[[], int] | None = None,
    throttle: LoginThrottle | None = None,
) -> Starlette:
    """The API over ``service``; every request (the OpenAPI document too) needs ``token`` (one
    admin token, or the named tokens whose roles each route checks). ``throttle`` refuses an
    address after repeated wrong tokens.

    ``max_body_bytes`` gives the body limit per request (default: ``settings.http.max_body_bytes``
    of the config at start; like every HTTP setting it changes only on restart).
    """
    from conduit_core.http._openapi import openapi_document

    document = _ENCODER.encode(openapi_document())

    literal_paths = frozenset(r.path for r in ROUTES if "{" not in r.path)

    def endpoint(route: ApiRoute) -> Callable[[Request], Awaitable[Response]]:
        handler = _HANDLERS[(route.method, route.path)]
        templated = "{" in route.path
        needed = route_role(route)
        what = f"{route.method} {route.path}"

        async def serve(request: Request) -> Response:
            if templated and request.scope["path"] in literal_paths:
                # GET /v1/work/batch: the literal route's path, with a method it does not serve.
                return method_not_allowed(request)
            try:
                require(principal_of(request), needed, what)
                body = None
                if route.body is not None:
                    body = _decode(route.body, await request.body())
                if service.host.stopping and route.method != "GET":
                    raise ConduitError("the daemon is stopping", code="daemon_stopping")
                result = await handler(service, request, body)
            except ConduitError as exc:
                status = status_for(exc)
                if status >= 500:
                    # A store outage answers every request 503 while it lasts; the host logs the
                    # outage once, so the requests it fails stay at DEBUG (no line per request).
                    level = logging.DEBUG if exc.code in STORE_OUTAGE_CODES else logging.WARNING
                    log.log(level, "%s %s failed: [%s] %s", route.method, route.path, exc.code, exc)
                return _error(exc.message, exc.code, status)
            # A submit answered with the Work its dedup key already names created nothing: 200.
            deduplicated = isinstance(result, WorkDetail) and result.deduplicated
            return _json(result, 200 if deduplicated else route.status)

        return serve

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    at_start = service.config.settings.http.max_body_bytes

    def limit() -> int:
        return at_start

    routes = [Route(r.path, endpoint(r), methods=[r.method]) for r in ROUTES]
    routes.append(Route("/v1/openapi.json", openapi, methods=["GET"]))
    guard = Middleware(
        RequestGuard, authorized=bearer_check(TokenSet.of(token)),
        max_body=max_body_bytes or limit, throttle=throttle,
    )  # fmt: skip
    app = Starlette(routes=routes, middleware=[guard])

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(f"no route {request.method} {request.url.path}", "not_found", 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return method_not_allowed(request)

    def method_not_allowed(request: Request) -> Response:
        # One Route per (path, method): Starlette's own Allow would name only the first match.
        allow = allowed_methods(app, request.scope)
        response = _error(
            f"method {request.method} not allowed on {request.url.path} (allowed: "
            f"{', '.join(allow)})",
            "method_not_allowed",
            405,
        )
        response.headers["Allow"] = ", ".join(allow)
        return response

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error("internal error (see the daemon log)", "internal_error", 500)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    app.add_exception_handler(500, internal)
    return app
