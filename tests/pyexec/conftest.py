"""The daemon fixtures (a real daemon per test, on SQLite and PostgreSQL) for the daemon test."""

from tests.daemon.conftest import daemons, make_daemon, store  # noqa: F401
from tests.storage.conftest import postgres_url, sqlite_url  # noqa: F401
