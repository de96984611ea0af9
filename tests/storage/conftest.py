"""Backends for the storage tests: every case runs on SQLite and on a real PostgreSQL server.

PostgreSQL comes from ``CONDUIT_TEST_PG_URL`` (default: the local server over its Unix socket);
each test gets a fresh database, created and dropped through the maintenance database. Under
CI (``tests/_ci.py``) an unreachable server fails the run instead of skipping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import msgspec
import pytest

pytest.register_assert_rewrite("conduit_core.storage.conformance")

from conduit_core.model import WorkKind  # noqa: E402
from conduit_core.storage import ClaimRequest, Store, open_store  # noqa: E402
from conduit_core.storage.conformance import (  # noqa: E402
    LEASE_MS,
    T0,
    StoreFactory,
    make_input,
    make_work,
    snapshot,
)
from tests._ci import unavailable  # noqa: E402

PG_URL = os.environ.get(
    "CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)


def _postgres_unavailable(reason: str) -> NoReturn:
    unavailable(f"PostgreSQL unreachable at {PG_URL} ({reason})")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL to a fresh, empty PostgreSQL database, dropped afterwards."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the postgres extra is installed in dev
        _postgres_unavailable(str(exc))
        raise
    name = f"conduit_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        _postgres_unavailable(str(exc).strip())
        raise
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'conduit.db'}"


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres")]
)
def store_url(request: pytest.FixtureRequest) -> str:
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def store_factory(store_url: str) -> StoreFactory:
    return StoreFactory(open=lambda: open_store(store_url), url=store_url)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """One open handle on the store under test, closed after the test."""
    handle = await open_store(store_url)
    try:
        yield handle
    finally:
        await handle.aclose()


@pytest.fixture
async def two(store_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two handles on one store, as two daemons have."""
    a = await open_store(store_url)
    b = await open_store(store_url)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def claimed_known(store: Store, work_id: str) -> Any:
    """A standing Work claimed by owner ``a``, its attempt written once by its holder, who then
    knows the row (so its settlement takes the known-revision fast path)."""
    await store.create_work(
        make_work(work_id, kind=WorkKind.STANDING), first_input=make_input(f"{work_id}-1")
    )
    claim = await store.claim_attempt(
        ClaimRequest(work_id=work_id, snapshot=snapshot()), owner="a", now_ms=T0,
        lease_ms=LEASE_MS,
    )  # fmt: skip
    await store.update_attempt(
        claim.lease, lambda ex: msgspec.structs.replace(ex, launch_intent={"n": 1}), now_ms=T0
    )
    return claim


def record_batch_sizes(
    monkeypatch: pytest.MonkeyPatch, registry: dict[Any, Any], kind: Any, position: int
) -> list[int]:
    """Wrap the function at ``position`` of ``registry[kind]`` (a pair taking ``(cx, calls)``,
    as ``_sqlstore.IN_TWO_STEPS`` and ``READ_AHEAD`` hold) to record how many calls each batch
    gives it."""
    pair = list(registry[kind])
    fn = pair[position]
    sizes: list[int] = []

    def counted(cx: Any, calls: list[Any]) -> Any:
        sizes.append(len(calls))
        return fn(cx, calls)

    pair[position] = counted
    monkeypatch.setitem(registry, kind, tuple(pair))
    return sizes


def count_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Round trips of the store's pipelined PostgreSQL transactions from now on: ``[n]``,
    counted as they happen (each ``Pipeline.sync`` is one)."""
    from conduit_core.storage._pipeline import Pipeline

    counted = [0]
    sync = Pipeline.sync

    def counting(self: Any) -> None:
        counted[0] += 1
        sync(self)

    monkeypatch.setattr(Pipeline, "sync", counting)
    return counted
