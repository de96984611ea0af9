"""Bad input: each is a clear error naming the store, with a stable code, and nothing written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from conduit_core.errors import StoreError
from conduit_core.storage import SCHEMA_VERSION, open_store

pytestmark = pytest.mark.anyio


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


async def _refused(url: str | Path, code: str) -> StoreError:
    with pytest.raises(StoreError) as caught:
        await open_store(url)
    assert caught.value.code == code, caught.value
    return caught.value


async def test_text_file_is_refused_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    before = _files(tmp_path)
    error = await _refused(path, "store_corrupt")
    assert str(path) in error.message
    assert "not an SQLite database" in error.message
    assert _files(tmp_path) == before


async def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    before = _files(tmp_path)
    error = await _refused(f"sqlite://{path}", "foreign_store")
    assert str(path) in error.message
    assert "users" in error.message
    assert _files(tmp_path) == before


async def test_damaged_conduit_file_is_refused_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "conduit.db"
    await (await open_store(path)).aclose()
    data = bytearray(path.read_bytes())
    data[100:] = b"\xde\xad\xbe\xef" * ((len(data) - 100) // 4)
    path.write_bytes(bytes(data))
    before = _files(tmp_path)
    error = await _refused(path, "store_corrupt")
    assert str(path) in error.message
    assert _files(tmp_path) == before


async def test_unknown_scheme_names_the_url_with_password_masked() -> None:
    error = await _refused("mysql://ada:hunter2@db.example/conduit", "invalid_store_url")
    assert "mysql://ada:***@db.example/conduit" in error.message
    assert "hunter2" not in error.message


async def test_unreachable_postgres_is_store_unreachable() -> None:
    error = await _refused("postgresql://ada:hunter2@127.0.0.1:1/conduit", "store_unreachable")
    assert "postgresql://ada:***@127.0.0.1:1/conduit" in error.message
    assert "hunter2" not in error.message


async def test_newer_sqlite_schema_is_refused_without_writing(tmp_path: Path) -> None:
    path = tmp_path / "conduit.db"
    await (await open_store(path)).aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE conduit_meta SET value = '999' WHERE key = 'schema_version'")
    conn.close()
    before = _files(tmp_path)
    error = await _refused(path, "store_schema_newer")
    assert str(path) in error.message
    assert "999" in error.message
    assert _files(tmp_path) == before


async def test_newer_postgres_schema_is_refused_without_writing(postgres_url: str) -> None:
    await (await open_store(postgres_url)).aclose()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE conduit_meta SET value = '999' WHERE key = 'schema_version'")
        before = conn.execute("SELECT key, value FROM conduit_meta ORDER BY key").fetchall()
    await _refused(postgres_url, "store_schema_newer")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT key, value FROM conduit_meta ORDER BY key").fetchall() == before


async def test_open_creates_then_reopens_at_current_schema(store_url: str) -> None:
    await (await open_store(store_url)).aclose()
    first = _meta(store_url)
    store = await open_store(store_url)  # a second open finds nothing to migrate
    await store.aclose()
    # Both backends: the schema version is the current one, and the reopen changed nothing.
    assert first["schema_version"] == str(SCHEMA_VERSION)
    assert _meta(store_url) == first


def _meta(store_url: str) -> dict[str, str]:
    """conduit_meta and the table list, read straight from the backend."""
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url[len("sqlite://") :]) as conn:
            meta = dict(conn.execute("SELECT key, value FROM conduit_meta").fetchall())
            tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            meta["tables"] = ",".join(sorted(r[0] for r in tables))
        conn.close()
        return meta
    with psycopg.connect(store_url, autocommit=True) as pg:
        meta = dict(pg.execute("SELECT key, value FROM conduit_meta").fetchall())
        tables = pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        meta["tables"] = ",".join(sorted(r[0] for r in tables))
    return meta
