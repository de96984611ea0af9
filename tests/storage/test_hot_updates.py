"""PostgreSQL: the attempt table keeps room on each page for heap-only (HOT) updates.

Between its claim and its settlement an attempt's row is written with its launch intent and its
recovery metadata (``_KNOWN_UPDATE_SQL``: status, data, revision). No index covers those
columns, so PostgreSQL can write the new version on the same page and prune the old one in
place, leaving nothing for the indexes or autovacuum, but only if the page has room while a
concurrent transaction still sees the old version. Attempts are inserted one after another, so
without free space kept on each page (the table's ``fillfactor``) a busy store's pages fill up
and such writes leave a dead row version behind. ``bench/bench_daemon.py`` measures the effect
(``dead_per_job_by_table``: the attempt table's non-heap-only dead versions per job went from
1.54 to 1.19 at 100 jobs/s with 70 %; at 300 jobs/s, from 1.56-1.69 at 70 % to 1.13-1.19 at 40 %,
schema V14, which also kept room on the inputs' pages for a claim's write of its input, until
V15 dropped that write and the room with it). Here: a store opened fresh, and one upgraded from
version 6, both have the settings.
"""

from __future__ import annotations

import psycopg
import pytest

from conduit_core.storage._postgres import PostgresStore
from conduit_core.storage._schema import MIGRATIONS, PerBackend

#: Each table's page room (schema V7, then V14: the attempt table 40 %; the inputs' 70 % of V14
#: is reset by V15, which no longer rewrites a consumed input).
ROOM = {"conduit_execution": "40", "conduit_event": None}


def _fillfactor(url: str, table: str = "conduit_execution") -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = %s", (table,)
        ).fetchone()
    options = dict(o.split("=", 1) for o in (row[0] or [])) if row else {}
    return options.get("fillfactor")


def test_a_new_store_keeps_room_for_heap_only_attempt_writes(postgres_url: str) -> None:
    PostgresStore.open(postgres_url, masked_url="postgresql://test").close()
    assert {table: _fillfactor(postgres_url, table) for table in ROOM} == ROOM


@pytest.mark.parametrize("version", [6])
def test_an_upgraded_store_keeps_room_too(postgres_url: str, version: int) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE conduit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for step in MIGRATIONS[:version]:
            for statement in step:
                sql = statement.postgres if isinstance(statement, PerBackend) else statement
                if sql is not None:
                    conn.execute(sql)
        conn.execute("INSERT INTO conduit_meta VALUES ('store_kind', 'conduit')")
        conn.execute("INSERT INTO conduit_meta VALUES ('schema_version', %s)", (str(version),))
    assert _fillfactor(postgres_url) is None
    PostgresStore.open(postgres_url, masked_url="postgresql://test").close()
    assert {table: _fillfactor(postgres_url, table) for table in ROOM} == ROOM
