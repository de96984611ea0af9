"""Fixtures for the fault tests: real daemons against a private PostgreSQL server they may lose.

Under CI a private server that cannot be started fails the test (never a skip).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests._ci import unavailable
from tests.container.conftest import docker_api  # noqa: F401
from tests.daemon.conftest import daemons, make_daemon, store  # noqa: F401
from tests.faults._pgserver import PgServerError, PrivateServer
from tests.storage.conftest import postgres_url, sqlite_url  # noqa: F401


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PrivateServer]:
    """One private server per test session (per xdist worker); every test gets its own database."""
    try:
        server = PrivateServer()
    except PgServerError as exc:
        unavailable(f"cannot set up a private PostgreSQL server: {exc}")
    try:
        server.init()
    except (PgServerError, OSError) as exc:
        log = server.logfile.read_text() if server.logfile.exists() else ""
        server.destroy()
        unavailable(f"cannot start a private PostgreSQL server: {exc}\n{log[-2000:]}")
    yield server
    server.destroy()


@pytest.fixture
def private_pg(pg_server: PrivateServer) -> Iterator[PrivateServer]:
    """The private server, running at the start and at the end of the test."""
    if not pg_server.running():
        pg_server.start()
    yield pg_server
    if not pg_server.running():
        pg_server.start()


@pytest.fixture
def private_pg_url(private_pg: PrivateServer) -> str:
    return private_pg.create_database(f"conduit_fault_{uuid.uuid4().hex[:12]}")
