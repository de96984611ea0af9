"""``/metrics`` counts Work per state at every scrape; its read must not grow with the history
(issue 32: "queue depth ... without scans").

``work_counts`` read every Work row (``GROUP BY status`` over the table): 0.4 s a scrape with
2 million ended Work on PostgreSQL, and a store that runs 300 jobs/s gains 26 million a day.
It now counts only the states of Work that has not ended, one range of the status index each;
``ended_work_counts`` counts the ended ones, and ``/metrics`` reads those seldom
(``http._metrics.EndedCounts``).

The measure is the rows the read touches, from the database itself, on a connection of the
test's own running the store's read: PostgreSQL's statistics of this transaction (index
entries and heap rows read: ``pg_stat_get_xact_tuples_returned``, ``pg_stat_xact_user_tables``),
SQLite's virtual-machine steps (a progress handler called every 100 instructions). The same read is measured before and after 3,000 ended Work are added; the
ended count is measured too, as the control that the instrument sees a read of history.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from conduit_core.model import WorkStatus
from conduit_core.storage import _ops_work, open_store
from conduit_core.storage.conformance import make_input, make_work

pytestmark = pytest.mark.anyio

OPEN = 12
ENDED = 3_000

Read = Callable[[Any], dict[str, int]]


def _sqlite_cost(path: str, read: Read) -> tuple[dict[str, int], int]:
    from conduit_core.storage._sqlite import _SqliteCx

    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    conn = sqlite3.connect(path)
    try:
        conn.set_progress_handler(step, 100)
        counts = read(_SqliteCx(conn))
    finally:
        conn.close()
    return counts, steps[0]


#: Index entries read by this transaction, over every index of the Work table.
_PG_TUPLES = (
    "SELECT COALESCE(SUM(pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index "
    "WHERE indrelid = 'conduit_work'::regclass"
)
_PG_HEAP = (
    "SELECT COALESCE(SUM(seq_tup_read), 0) FROM pg_stat_xact_user_tables "
    "WHERE relname = 'conduit_work'"
)


def _postgres_cost(url: str, read: Read) -> tuple[dict[str, int], int]:
    import psycopg

    from conduit_core.storage._postgres import _PgCx

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("BEGIN")
        counts = read(_PgCx(cur))
        index = cur.execute(_PG_TUPLES).fetchone()
        heap = cur.execute(_PG_HEAP).fetchone()
        cur.execute("ROLLBACK")
    assert index is not None
    assert heap is not None
    return counts, int(index[0]) + int(heap[0])


def _analyze(url: str) -> None:
    """Planner statistics, as autovacuum keeps them on a store with history (a young store's
    are gathered by the daemon: ``tests/daemon/test_planner_statistics.py``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE conduit_work")


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_the_open_work_count_reads_no_ended_work(store_url: str) -> None:
    sqlite = not store_url.startswith("postgres")
    path = store_url.split("://", 1)[-1].split("?", 1)[0] if sqlite else ""

    def cost(read: Read) -> tuple[dict[str, int], int]:
        if sqlite:
            return _sqlite_cost(path, read)
        _analyze(store_url)
        return _postgres_cost(store_url, read)

    async with await open_store(store_url) as store:
        await store.create_works(
            [(make_work(f"open{i:03}"), make_input(f"in{i:03}")) for i in range(OPEN)]
        )
        before, young = cost(_ops_work.work_counts)
        _, ended_young = cost(_ops_work.ended_work_counts)
        ended = [
            (msgspec.structs.replace(make_work(f"old{i:05}"), status=status), None)
            for i, status in enumerate(
                [WorkStatus.COMPLETED, WorkStatus.FAILED, WorkStatus.CANCELLED] * (ENDED // 3)
            )
        ]
        assert not [r for r in await store.create_works(ended) if not hasattr(r, "id")]
        after, old = cost(_ops_work.work_counts)
        ended_counts, ended_old = cost(_ops_work.ended_work_counts)
        assert ended_counts == await store.ended_work_counts()
        assert after == await store.work_counts()

    assert before == after
    assert after["ready"] == after["startable"] == OPEN
    assert set(after) == {"ready", "running", "waiting", "held", "exhausted", "startable"}
    assert ended_counts == {"completed": ENDED // 3, "failed": ENDED // 3,
                            "cancelled": ENDED // 3}  # fmt: skip
    # The control: counting the ended Work reads them, and the instrument sees it.
    assert ended_old >= ended_young + ENDED // (30 if sqlite else 1), (ended_young, ended_old)
    # The open count reads what it read before the history was added, give or take a little.
    assert old <= young * 2 + 20, (young, old)
