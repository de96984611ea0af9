"""A young PostgreSQL store gets planner statistics before autovacuum's first look (issue 32).

Autovacuum analyzes a table at most once a minute. Until then a store filling at hundreds of
jobs a second is planned without statistics: a claim's read of its Work's inputs went through
the whole input table (a sequential scan and a hash join, 2-5 ms instead of tens of
microseconds, found with ``auto_explain`` under ``bench_daemon.py``). ``refresh_statistics``
ANALYZEs each conduit table with more than twice the live rows its statistics describe; after
it the same read goes by index.
"""

from __future__ import annotations

import time

import anyio
import psycopg
import pytest

from conduit_core.storage import Store, open_store
from conduit_core.storage._ops_work import PENDING_INPUTS_FROM
from conduit_core.storage._pg_statistics import MIN_ROWS
from conduit_core.storage.conformance import make_input, make_work

pytestmark = pytest.mark.anyio

WORKS = 3 * MIN_ROWS


def _inputs_plan(url: str, work_ids: list[str]) -> str:
    """The plan of a claim's read of its Work's inputs, as the store's connections plan it."""
    marks = ", ".join("%s" for _ in work_ids)
    query = PENDING_INPUTS_FROM + f"w.id IN ({marks}) ORDER BY e.seq"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET enable_bitmapscan = off")  # as ``_postgres._configure`` sets it
        rows = conn.execute("EXPLAIN " + query, work_ids).fetchall()
    return "\n".join(row[0] for row in rows)


async def _refreshed(store: Store) -> list[str]:
    """The tables the first refresh that finds any analyzes: the server's per-table counts
    reach its statistics views a moment after the writing backend commits or exits."""
    deadline = time.monotonic() + 30
    while True:
        tables = await store.refresh_statistics()
        if tables or time.monotonic() > deadline:
            return tables
        await anyio.sleep(0.2)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_young_store_is_analyzed_and_its_claims_read_inputs_by_index(
    store_url: str,
) -> None:
    async with await open_store(store_url) as store:
        assert await store.refresh_statistics() == []  # empty tables: nothing worth it
        items = [(make_work(f"w{i:05}"), make_input(f"in{i:05}")) for i in range(WORKS)]
        await store.create_works(items)
    claimed = [f"w{i:05}" for i in range(100, 107)]
    before = _inputs_plan(store_url, claimed)
    async with await open_store(store_url) as store:
        tables = await _refreshed(store)
        assert {"conduit_work", "conduit_event"} <= set(tables), tables
        assert await store.refresh_statistics() == []  # described now: nothing to do again
    after = _inputs_plan(store_url, claimed)
    assert "Seq Scan on conduit_event" in before, before
    assert "Seq Scan on conduit_event" not in after, after
    assert "conduit_event_work" in after, after
    with psycopg.connect(store_url, autocommit=True) as conn:
        described = dict(
            conn.execute(
                "SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)",
                (["conduit_work", "conduit_event"],),
            ).fetchall()
        )
    assert all(count >= WORKS * 0.9 for count in described.values()), described


async def test_sqlite_needs_no_statistics(sqlite_url: str) -> None:
    async with await open_store(sqlite_url) as store:
        await store.create_works([(make_work(f"w{i}"), make_input(f"in{i}")) for i in range(50)])
        assert await store.refresh_statistics() == []
