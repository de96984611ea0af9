"""The Work-search migration on a store written before it, on both backends: existing Work gets
its created time, ``exhausted`` when it waits for a person's retry, and its first input's values
for ``input.KEY`` search; the search then reads it like Work written after."""

from __future__ import annotations

import sqlite3
from typing import Any

import anyio
import msgspec
import psycopg

from conduit_core.model import Event, Work, WorkStatus
from conduit_core.storage import WorkQuery, open_store
from conduit_core.storage._schema import MIGRATIONS, PerBackend

#: The search migration, found by what it creates (its number changes as branches merge).
SEARCH = next(i for i, step in enumerate(MIGRATIONS)
              if any("conduit_work_created " in str(s) for s in step))  # fmt: skip


def _old_rows() -> list[tuple[str, tuple[Any, ...]]]:
    enc = msgspec.json.Encoder()
    rows = []
    for n, (status, blocked) in enumerate(
        [(WorkStatus.COMPLETED, None), (WorkStatus.READY, "retry_exhausted"),
         (WorkStatus.READY, None)]
    ):  # fmt: skip
        work = Work(id=f"old-{n}", scope="root", binding="b", status=status,
                    created_at_ms=1000 - n, updated_at_ms=2000, blocked_reason=blocked)  # fmt: skip
        event = Event(id=f"ev-{n}", delivery_id=f"ev-{n}", type="core.input", work_id=work.id,
                      payload={"customer": f"c{n % 2}"}, accepted_at_ms=1000 + n)  # fmt: skip
        rows.append((
            "INSERT INTO conduit_work (id, status, scope, claimable, ready_since, data, binding) "
            "VALUES (?, ?, ?, 0, 0, ?, 'b')",
            (work.id, str(status), "root", enc.encode(work).decode()),
        ))  # fmt: skip
        rows.append((
            "INSERT INTO conduit_event (id, delivery_id, seq, work_id, pending, data) "
            "VALUES (?, ?, ?, ?, 0, ?)",
            (event.id, event.id, n + 1, work.id, enc.encode(event).decode()),
        ))  # fmt: skip
    return rows


def _statements(postgres: bool) -> list[str]:
    out = ["CREATE TABLE conduit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"]
    for step in MIGRATIONS[:SEARCH]:
        for statement in step:
            sql = (statement.postgres if postgres else statement.sqlite) if isinstance(
                statement, PerBackend) else statement  # fmt: skip
            if sql is not None:
                out.append(sql)
    return out


def _check(url: str) -> None:
    async def read() -> None:
        store = await open_store(url)
        try:
            newest, _ = await store.search_work(WorkQuery())
            assert [w.id for w in newest] == ["old-0", "old-1", "old-2"]  # by created time, not id
            exhausted, _ = await store.search_work(WorkQuery(status="exhausted"))
            assert [w.id for w in exhausted] == ["old-1"]
            ready, _ = await store.search_work(WorkQuery(status="ready"))
            assert [w.id for w in ready] == ["old-2"]
            acme, _ = await store.search_work(
                WorkQuery(input_key="customer", input_value="c0", newest_first=False)
            )
            assert [w.id for w in acme] == ["old-2", "old-0"]
        finally:
            await store.aclose()

    anyio.run(read)


def test_sqlite_store_written_before_search_is_searchable(sqlite_url: str) -> None:
    path = sqlite_url.removeprefix("sqlite://")
    conn = sqlite3.connect(path, isolation_level=None)
    for sql in _statements(postgres=False):
        conn.execute(sql)
    conn.execute("INSERT INTO conduit_meta VALUES ('store_kind', 'conduit')")
    conn.execute("INSERT INTO conduit_meta VALUES ('schema_version', ?)", (str(SEARCH),))
    for sql, params in _old_rows():
        conn.execute(sql, params)
    conn.close()
    _check(sqlite_url)


def test_postgres_store_written_before_search_is_searchable(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for sql in _statements(postgres=True):
            conn.execute(sql)  # type: ignore[arg-type]
        conn.execute("INSERT INTO conduit_meta VALUES ('store_kind', 'conduit')")
        conn.execute("INSERT INTO conduit_meta VALUES ('schema_version', %s)", (str(SEARCH),))
        for sql, params in _old_rows():
            conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
    _check(postgres_url)
