"""Property: whatever body a caller sends to any route that takes one, the API answers with a
coded 4xx refusal or a success, never a 5xx, and a refused request changes nothing in the store.

The app is the daemon's own (``create_app`` + ``mount_schedules``) over a real SQLite store and
scheduler, driven in-process through ASGI so hypothesis can send thousands of bodies quickly.
Bounded by the suite's hypothesis profile (``default``: 60 bodies per route in CI;
``HYPOTHESIS_PROFILE=long`` for a longer manual run).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core.config import parse_config
from conduit_core.http import ApiService, create_app
from conduit_core.http.routes_schedules import mount_schedules
from conduit_core.plugins import Plugins
from conduit_core.routines import ConduitRoutineSource, ScheduleMultiplexer
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import Store, open_store

TOKEN = "fuzz-token"
CONFIG = """\
[settings]
store = "unused.db"
http.max_body_bytes = 16384

[scopes.team]

[bindings.ok]
executor = "shell"
scope = "team"
config = { command = "true" }

[bindings.echo]
executor = "echo"
"""
CODE = re.compile(r"^[a-z][a-z0-9_]*$")

#: (method, path, the body's field names): every route that reads a body.
ROUTES = [
    ("POST", "/v1/work", ("binding", "scope", "kind", "input", "id")),
    ("POST", "/v1/work/seed/input", ("payload", "type", "correlation_key", "delivery_id")),
    ("POST", "/v1/work/seed/inject", ("payload", "type", "correlation_key", "delivery_id")),
    ("POST", "/v1/work/seed/cancel", ("reason",)),
    ("POST", "/v1/work/seed/retry", ("reason",)),
    ("POST", "/v1/work/seed/interrupt", ("reason",)),
    ("POST", "/v1/work/seed/approve", ("reason",)),
    ("POST", "/v1/work/seed/refuse", ("reason",)),
    ("POST", "/v1/work/seed/release", ("reason",)),
    ("POST", "/v1/schedules", ("spec", "timezone", "domain", "source", "id", "scope", "target",
                               "misfire", "grace_seconds", "extra")),
    ("PATCH", "/v1/schedules/seed", ("action", "spec", "timezone")),
]  # fmt: skip


class Api:
    """The daemon's app over a real store, run on one event loop in a portal thread."""

    def __init__(self, portal: BlockingPortal, store: Store, app: Any) -> None:
        self.portal = portal
        self.store = store
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://conduit",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )

    def send(self, method: str, path: str, body: bytes) -> httpx.Response:
        async def call() -> httpx.Response:
            return await self.client.request(
                method, path, content=body, headers={"Content-Type": "application/json"}
            )

        return self.portal.call(call)

    def snapshot(self) -> bytes:
        """Everything a request could have written: the Work (with its input counts and status)
        and the Routines."""

        async def read() -> bytes:
            work = await self.store.list_work(limit=10_000)
            inputs = [await self.store.pending_inputs(w.id) for w in work]
            routines = await self.store.list_routines()
            return msgspec.json.encode([work, inputs, routines])

        return self.portal.call(read)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("api-bodies")
    config = parse_config(CONFIG)
    with start_blocking_portal() as portal:
        store: Store = portal.call(open_store, str(root / "conduit.db"))
        try:
            options = SchedulerOptions.from_config(
                config, config_generation=1, owner="fuzz", state_dir=str(root / "state")
            )
            clock = SystemClock()
            service = ApiService(config, Scheduler(store, clock, Plugins.load(), options))
            routines = ConduitRoutineSource(
                store, clock, bindings={"ok": "team", "echo": "root"}, scopes={"root", "team"}
            )
            app = mount_schedules(
                create_app(service, TOKEN), ScheduleMultiplexer([routines]), TOKEN
            )
            api = Api(portal, store, app)
            seeded = api.send("POST", "/v1/work", b'{"binding": "ok", "id": "seed"}')
            assert seeded.status_code == 201, seeded.text
            routine = b'{"id": "seed", "spec": "0 * * * *", "target": {"binding": "echo"}}'
            assert api.send("POST", "/v1/schedules", routine).status_code == 201
            yield api
            portal.call(api.client.aclose)
        finally:
            portal.call(store.close)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
#: Strings a hostile caller likes: control characters, newlines, paths, huge numbers as text.
nasty_text = st.sampled_from(
    ["", " ", "a\n", "\n", "../../etc/x", "a/b", "x" * 5000, "\x00", "k:0", "ok", "echo", "team",
     "core.input", "0 * * * *", "* * * * * *", "once@9999-12-31T23:59:59-23:59", "America",
     "1e308", "pause", "edit", "run", "task", "standing", "coalesce", "conduit"]
)  # fmt: skip
field_values = json_values | nasty_text | st.sampled_from([1e308, -1.7e308, -5, 0, 2**63, -(2**64)])


@st.composite
def bodies(draw: st.DrawFn, fields: tuple[str, ...]) -> bytes:
    """A body: mostly objects with the route's own field names (so decoding gets past the
    shape), sometimes any JSON, deep nesting, or raw bytes."""
    kind = draw(st.integers(0, 9))
    if kind <= 5:
        names = draw(st.lists(st.sampled_from(fields), unique=True, max_size=len(fields)))
        extra = draw(st.dictionaries(st.text(max_size=8), field_values, max_size=1))
        body = extra | {name: draw(field_values) for name in names}
        return msgspec.json.encode(body)
    if kind <= 7:
        return msgspec.json.encode(draw(json_values))
    if kind == 8:
        depth = draw(st.integers(60, 3000))
        field = draw(st.sampled_from(fields))
        return b'{"' + field.encode() + b'": ' + b"[" * depth + b"]" * depth + b"}"
    return draw(st.binary(max_size=64)) + draw(st.sampled_from([b"", b"x" * 20_000]))


@pytest.mark.parametrize(
    ("method", "path", "fields"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES]
)
def test_any_body_is_answered_with_a_code_and_a_refusal_writes_nothing(
    api: Api, method: str, path: str, fields: tuple[str, ...]
) -> None:
    @settings(
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=bodies(fields))
    def check(body: bytes) -> None:
        before = api.snapshot()
        reply = api.send(method, path, body)
        assert reply.status_code < 500, (reply.status_code, reply.text, body[:300])
        if reply.status_code >= 400:
            error = reply.json()
            assert set(error) == {"error", "code"}, error
            assert CODE.match(error["code"]), error
            assert error["code"] != "internal_error", error
            assert reply.status_code != 413 or len(body) > 16384
            assert api.snapshot() == before, (reply.status_code, error, body[:300])

    check()


def test_the_property_can_fail(api: Api) -> None:
    """Negative control: a request that does write changes the snapshot the property compares."""
    before = api.snapshot()
    reply = api.send("POST", "/v1/work", b'{"binding": "echo"}')
    assert reply.status_code == 201
    assert api.snapshot() != before
