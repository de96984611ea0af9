"""``/v1/schedules``: the unified schedule surface over a :class:`ScheduleMultiplexer`.

``GET /v1/schedules`` always answers 200 with every source's records and status (a source that
is down is ``degraded``, never an error). Writes route to the owning source: ``POST`` creates
(201), ``PATCH /{id}`` pauses, resumes or edits (body ``{"action": …}``), ``DELETE /{id}`` removes
(204), ``POST /{id}/run`` fires now (202), ``GET /{id}/history`` lists a Routine's fires.
Refusals answer ``{error, code}`` with each error's own HTTP status (403 observe-only, 404,
409 busy/owner, 422 domain, 503 source down, 400 bad spec).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.http._app import ApiRoute, decode_body, page_limit, status_for
from conduit_core.http._guard import bearer_check
from conduit_core.http._schemas import ErrorBody
from conduit_core.http._tokens import Principal, TokenSet, actor_of, principal_of, require
from conduit_core.model import WorkTemplate
from conduit_core.routines import (
    ConduitRoutineSource,
    MergedRead,
    ScheduleChange,
    ScheduleCreate,
    ScheduleMultiplexer,
    ScheduleRecord,
)
from conduit_core.storage import RoutineRun
from conduit_core.validation import NameStr, WorkIdStr

__all__ = [
    "SCHEDULE_ROUTES",
    "ScheduleCreateBody",
    "TargetBody",
    "mount_schedules",
    "schedule_routes",
]

log = logging.getLogger("conduit.http")

_ENCODER = msgspec.json.Encoder()


class TargetBody(WorkTemplate, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``target`` of ``POST /v1/schedules``: a typo is refused, names and ids follow the grammar."""

    binding: NameStr | None = None
    scope: NameStr | None = None
    work_id: WorkIdStr | None = None


class ScheduleCreateBody(ScheduleCreate, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/schedules`` (a :class:`ScheduleCreate` with a checked target)."""

    target: TargetBody | None = None

    def request(self) -> ScheduleCreate:
        """The plain request the sources take (their records hold plain WorkTemplates)."""
        fields = {name: getattr(self, name) for name in ScheduleCreate.__struct_fields__}
        if self.target is not None:
            fields["target"] = msgspec.convert(msgspec.to_builtins(self.target), WorkTemplate)
        return ScheduleCreate(**fields)


_CREATE = msgspec.json.Decoder(ScheduleCreateBody)
_CHANGE = msgspec.json.Decoder(ScheduleChange)

#: The routes below as the OpenAPI document describes them (same order).
SCHEDULE_ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute("GET", "/v1/schedules", "Every schedule source's records and status", MergedRead),
    ApiRoute("POST", "/v1/schedules", "Create a schedule in its owning source", ScheduleRecord,
             201, ScheduleCreateBody),
    ApiRoute("PATCH", "/v1/schedules/{id}", "Pause, resume, run now (202) or edit a schedule",
             ScheduleRecord, 200, ScheduleChange, also=(202,)),
    ApiRoute("DELETE", "/v1/schedules/{id}", "Delete a managed schedule", None, 204),
    ApiRoute("POST", "/v1/schedules/{id}/run", "Fire a schedule now", ScheduleRecord, 202),
    ApiRoute("GET", "/v1/schedules/{id}/history", "A Routine's fires, newest first",
             list[RoutineRun], query=(("limit", int, "how many fires (1-500, default 50)"),)),
)  # fmt: skip

Endpoint = Callable[[Request], Awaitable[Response]]


def _json(body: Any, status: int = 200) -> Response:
    return Response(_ENCODER.encode(body), status_code=status, media_type="application/json")


def _status(exc: ConduitError) -> int:
    own = getattr(exc, "http_status", None)
    return own if isinstance(own, int) else status_for(exc)


def schedule_routes(
    schedules: ScheduleMultiplexer | Callable[[], ScheduleMultiplexer],
    authorized: Callable[[Headers], object],
) -> list[Route]:
    """The ``/v1/schedules`` routes; ``schedules`` may be a callable (replaced on reload)."""

    def mux() -> ScheduleMultiplexer:
        return schedules if isinstance(schedules, ScheduleMultiplexer) else schedules()

    def guarded(
        handler: Callable[[Request], Awaitable[Response]], role: str = "viewer"
    ) -> Endpoint:
        async def serve(request: Request) -> Response:
            # The daemon's app checks the token first already; a bare app relies on this.
            who = authorized(request.headers)
            if not who:
                return _json(
                    ErrorBody(error="missing or wrong bearer token", code="unauthorized"), 401
                )
            if isinstance(who, Principal):
                request.state.principal = who
            try:
                require(principal_of(request), role, f"{request.method} {request.url.path}")
                return await handler(request)
            except ConduitError as exc:
                status = _status(exc)
                if status >= 500:
                    log.warning("%s %s failed: [%s] %s", request.method, request.url.path,
                                exc.code, exc)  # fmt: skip
                return _json(ErrorBody(error=exc.message, code=exc.code), status)

        return serve

    async def read(request: Request) -> Response:
        return _json(await mux().read())

    async def create(request: Request) -> Response:
        body: ScheduleCreateBody = decode_body(_CREATE, await request.body())
        return _json(await mux().create(body.request()), 201)

    async def change(request: Request) -> Response:
        body: ScheduleChange = decode_body(_CHANGE, await request.body())
        if body.action == "edit":  # pause, resume and run are an operator's; edits an admin's
            require(principal_of(request), "admin", "editing a schedule")
        record = await mux().change(request.path_params["id"], body, actor=actor_of(request))
        log.info("schedule %s %s actor=%s", request.path_params["id"], body.action,
                 actor_of(request) or "-")  # fmt: skip
        return _json(record, 202 if body.action == "run" else 200)

    async def delete(request: Request) -> Response:
        await mux().delete(request.path_params["id"])
        return Response(status_code=204)

    async def run_now(request: Request) -> Response:
        return _json(await mux().run_now(request.path_params["id"], actor=actor_of(request)), 202)

    async def history(request: Request) -> Response:
        schedule_id: str = request.path_params["id"]
        prefix, sep, local = schedule_id.partition(":")
        name, local_id = (prefix, local) if sep else ("conduit", schedule_id)
        for source in mux().sources:
            if source.name == name and isinstance(source, ConduitRoutineSource):
                unknown = sorted(set(request.query_params) - {"limit"})
                if unknown:
                    raise ConduitError(
                        f"unknown query parameter {unknown[0]!r}", code="invalid_query"
                    )
                limit = page_limit(request.query_params.get("limit", "50"))
                return _json(await source.history(local_id, limit=limit))
        raise NotFoundError("schedule with a run history", schedule_id)

    return [
        Route("/v1/schedules", guarded(read), methods=["GET"]),
        Route("/v1/schedules", guarded(create, "admin"), methods=["POST"]),
        Route("/v1/schedules/{id}", guarded(change, "operator"), methods=["PATCH"]),
        Route("/v1/schedules/{id}", guarded(delete, "admin"), methods=["DELETE"]),
        Route("/v1/schedules/{id}/run", guarded(run_now, "operator"), methods=["POST"]),
        Route("/v1/schedules/{id}/history", guarded(history), methods=["GET"]),
    ]


def mount_schedules(
    app: Starlette,
    schedules: ScheduleMultiplexer | Callable[[], ScheduleMultiplexer],
    token: str | TokenSet,
) -> Starlette:
    """Add ``/v1/schedules`` to the API app (``create_app(service, token)``), same tokens."""
    app.router.routes.extend(schedule_routes(schedules, bearer_check(TokenSet.of(token))))
    return app
