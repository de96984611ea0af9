"""``/v1/schedules``: the unified schedule surface over a :class:`ScheduleMultiplexer`.

``GET /v1/schedules`` always answers 200 with every source's records and status (a source that
is down is ``degraded``, never an error). Writes route to the owning source: ``POST`` creates
(201), ``PATCH /{id}`` pauses, resumes or edits (body ``{"action": …}``), ``DELETE /{id}`` removes
(204), ``POST /{id}/run`` fires now (202), ``GET /{id}/history`` lists a Routine's fires.
Refusals answer ``{error, code}`` with each error's own HTTP status (403 observe-only, 404,
409 busy/owner, 422 domain, 503 source down, 400 bad spec).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.http._app import status_for
from conduit_core.http._schemas import ErrorBody
from conduit_core.routines import (
    ConduitRoutineSource,
    ScheduleChange,
    ScheduleCreate,
    ScheduleMultiplexer,
)

__all__ = ["mount_schedules", "schedule_routes"]

log = logging.getLogger("conduit.http")

_ENCODER = msgspec.json.Encoder()
_CREATE = msgspec.json.Decoder(ScheduleCreate)
_CHANGE = msgspec.json.Decoder(ScheduleChange)

Endpoint = Callable[[Request], Awaitable[Response]]


def _json(body: Any, status: int = 200) -> Response:
    return Response(_ENCODER.encode(body), status_code=status, media_type="application/json")


def _status(exc: ConduitError) -> int:
    own = getattr(exc, "http_status", None)
    return own if isinstance(own, int) else status_for(exc)


def _decode(decoder: msgspec.json.Decoder[Any], raw: bytes) -> Any:
    try:
        return decoder.decode(raw.strip() or b"{}")
    except msgspec.ValidationError as exc:
        raise ConduitError(f"invalid request body: {exc}", code="invalid_body") from exc
    except msgspec.DecodeError as exc:
        raise ConduitError(f"malformed JSON: {exc}", code="invalid_json") from exc


def schedule_routes(
    schedules: ScheduleMultiplexer | Callable[[], ScheduleMultiplexer],
    authorized: Callable[[Request], bool],
) -> list[Route]:
    """The ``/v1/schedules`` routes; ``schedules`` may be a callable (replaced on reload)."""

    def mux() -> ScheduleMultiplexer:
        return schedules if isinstance(schedules, ScheduleMultiplexer) else schedules()

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Endpoint:
        async def serve(request: Request) -> Response:
            if not authorized(request):
                return _json(
                    ErrorBody(error="missing or wrong bearer token", code="unauthorized"), 401
                )
            try:
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
        return _json(await mux().create(_decode(_CREATE, await request.body())), 201)

    async def change(request: Request) -> Response:
        body: ScheduleChange = _decode(_CHANGE, await request.body())
        record = await mux().change(request.path_params["id"], body)
        return _json(record, 202 if body.action == "run" else 200)

    async def delete(request: Request) -> Response:
        await mux().delete(request.path_params["id"])
        return Response(status_code=204)

    async def run_now(request: Request) -> Response:
        return _json(await mux().run_now(request.path_params["id"]), 202)

    async def history(request: Request) -> Response:
        schedule_id: str = request.path_params["id"]
        prefix, sep, local = schedule_id.partition(":")
        name, local_id = (prefix, local) if sep else ("conduit", schedule_id)
        for source in mux().sources:
            if source.name == name and isinstance(source, ConduitRoutineSource):
                try:
                    limit = int(request.query_params.get("limit", "50"))
                except ValueError as exc:
                    raise ConduitError("limit must be an integer", code="invalid_query") from exc
                return _json(await source.history(local_id, limit=max(1, min(limit, 500))))
        raise NotFoundError("schedule with a run history", schedule_id)

    return [
        Route("/v1/schedules", guarded(read), methods=["GET"]),
        Route("/v1/schedules", guarded(create), methods=["POST"]),
        Route("/v1/schedules/{id}", guarded(change), methods=["PATCH"]),
        Route("/v1/schedules/{id}", guarded(delete), methods=["DELETE"]),
        Route("/v1/schedules/{id}/run", guarded(run_now), methods=["POST"]),
        Route("/v1/schedules/{id}/history", guarded(history), methods=["GET"]),
    ]


def mount_schedules(
    app: Starlette,
    schedules: ScheduleMultiplexer | Callable[[], ScheduleMultiplexer],
    token: str,
) -> Starlette:
    """Add ``/v1/schedules`` to the API app (``create_app(service, token)``), same bearer token."""
    expected = f"Bearer {token}".encode()

    def authorized(request: Request) -> bool:
        return hmac.compare_digest(request.headers.get("authorization", "").encode(), expected)

    app.router.routes.extend(schedule_routes(schedules, authorized))
    return app
