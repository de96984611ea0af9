"""``/v1/schedules`` over the multiplexer (conduit Routines + an unreadable crontab)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.applications import Starlette

from conduit_core.http.routes_schedules import mount_schedules
from conduit_core.routines import CrontabSource, ScheduleMultiplexer
from conduit_core.routines.managed import ConduitRoutineSource
from conduit_core.runtime import ManualClock
from conduit_core.storage import Store
from tests.routines.conftest import BINDINGS, SCOPES, T0

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"


async def call(
    app: Starlette, method: str, path: str, body: Any = None, token: str = TOKEN
) -> tuple[int, Any]:
    """Drive the ASGI app directly (one request, one response)."""
    raw = b"" if body is None else msgspec.json.encode(body)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "server": ("test", 80), "client": ("test", 1),
        "headers": [(b"authorization", f"Bearer {token}".encode()),
                    (b"content-type", b"application/json")],
    }  # fmt: skip
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, msgspec.json.decode(payload) if payload else None


@pytest.fixture
def app(store: Store, clock: ManualClock, tmp_path: Path) -> Starlette:
    pokes: list[int] = []
    conduit = ConduitRoutineSource(
        store, clock, bindings=BINDINGS, scopes=SCOPES, on_change=lambda: pokes.append(1)
    )
    crontab = CrontabSource.from_path(tmp_path / "missing-crontab", timezone="UTC")
    return mount_schedules(Starlette(), ScheduleMultiplexer([conduit, crontab]), TOKEN)


async def test_schedules_api_round_trip(app: Starlette) -> None:
    status, merged = await call(app, "GET", "/v1/schedules")
    assert status == 200
    states = {s["source"]: s["status"] for s in merged["sources"]}
    assert states == {"conduit": "ok", "crontab": "degraded"}  # a dead source never fails a read
    create = {"id": "hourly", "spec": "0 * * * *", "target": {"binding": "echo"}}
    status, record = await call(app, "POST", "/v1/schedules", create)
    assert (status, record["id"], record["status"]) == (201, "conduit:hourly", "idle")
    status, again = await call(app, "POST", "/v1/schedules", create)
    assert (status, again["code"]) == (409, "routine_exists")
    status, paused = await call(app, "PATCH", "/v1/schedules/hourly", {"action": "pause"})
    assert (status, paused["status"]) == (200, "paused")
    status, resumed = await call(app, "PATCH", "/v1/schedules/conduit:hourly", {"action": "resume"})
    assert (status, resumed["status"]) == (200, "idle")
    status, ran = await call(app, "POST", "/v1/schedules/hourly/run")
    assert (status, ran["next_run_at_ms"]) == (202, T0)
    status, edited = await call(
        app, "PATCH", "/v1/schedules/hourly", {"action": "edit", "spec": "30 * * * *"}
    )
    assert (status, edited["spec"]) == (200, "30 * * * *")
    status, history = await call(app, "GET", "/v1/schedules/hourly/history")
    assert (status, history) == (200, [])
    status, _ = await call(app, "DELETE", "/v1/schedules/hourly")
    assert status == 204
    status, gone = await call(app, "DELETE", "/v1/schedules/hourly")
    assert (status, gone["code"]) == (404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/v1/schedules", {"spec": "* * *", "target": {"binding": "echo"}}, 400,
         "invalid_cron_spec"),
        ("POST", "/v1/schedules", {"spec": "0 * * * *", "timezone": "X/Y",
                                   "target": {"binding": "echo"}}, 400, "invalid_timezone"),
        ("POST", "/v1/schedules", {"spec": "0 * * * *", "target": {"binding": "nope"}}, 422,
         "unknown_binding"),
        ("POST", "/v1/schedules", {"spec": "0 * * * *", "domain": "external",
                                   "source": "crontab"}, 403, "read_only_source"),
        ("POST", "/v1/schedules", {"spec": "0 * * * *", "source": "crontab"}, 422,
         "domain_violation"),
        ("PATCH", "/v1/schedules/crontab:1", {"action": "pause"}, 403, "read_only_source"),
        ("PATCH", "/v1/schedules/ghost", {"action": "pause"}, 404, "not_found"),
        ("POST", "/v1/schedules", {"spec": 5}, 400, "invalid_body"),
    ],
)  # fmt: skip
async def test_schedules_api_refusals(
    app: Starlette, store: Store, method: str, path: str, body: Any, status: int, code: str
) -> None:
    got, error = await call(app, method, path, body)
    assert (got, error["code"]) == (status, code), error
    assert await store.list_routines() == []


async def test_schedules_api_needs_the_token(app: Starlette) -> None:
    status, error = await call(app, "GET", "/v1/schedules", token="wrong")
    assert (status, error["code"]) == (401, "unauthorized")
