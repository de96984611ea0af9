"""What a store read costs, from the database itself: the read runs on a connection of the
test's own, in a transaction (rolled back), and the cost is PostgreSQL's statistics of that
transaction (index entries and heap rows of ``conduit_work`` read:
``pg_stat_get_xact_tuples_returned``, ``pg_stat_xact_user_tables``) or SQLite's virtual-machine
steps (a progress handler called every 100 instructions). Compare a read's cost on two states of
one store, not against a number."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from conduit_core.storage import CapacityLimits
from conduit_core.storage._ops_work import ClaimWrites
from conduit_core.storage._ready_reads import read_ready_later

T = TypeVar("T")

#: Index entries read by this transaction, over every index of the Work table.
_PG_TUPLES = (
    "SELECT COALESCE(SUM(pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index "
    "WHERE indrelid = 'conduit_work'::regclass"
)
_PG_HEAP = (
    "SELECT COALESCE(SUM(seq_tup_read), 0) FROM pg_stat_xact_user_tables "
    "WHERE relname = 'conduit_work'"
)


def ready_ids(capacity: CapacityLimits, limit: int = 4) -> Callable[[Any], list[str]]:
    """A claim's read of the ready queue (``read_ready_later``) for up to ``limit`` Work under
    ``capacity``, as ``read_cost`` runs it: the ids it returns, sorted."""

    def read(cx: Any) -> list[str]:
        ready = read_ready_later(cx, capacity, limit, ClaimWrites(cx))
        assert ready is not None
        return sorted(ready.rows())

    return read


def read_cost(store_url: str, read: Callable[[Any], T]) -> tuple[T, int]:
    """``read(cx)``'s result and its cost (see the module)."""
    if store_url.startswith("postgres"):
        _analyze(store_url)
        return _postgres_cost(store_url, read)
    return _sqlite_cost(store_url.split("://", 1)[-1].split("?", 1)[0], read)


def _sqlite_cost(path: str, read: Callable[[Any], T]) -> tuple[T, int]:
    from conduit_core.storage._sqlite import _SqliteCx

    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    conn = sqlite3.connect(path)
    try:
        conn.set_progress_handler(step, 100)
        result = read(_SqliteCx(conn))
        conn.rollback()
    finally:
        conn.close()
    return result, steps[0]


def _postgres_cost(url: str, read: Callable[[Any], T]) -> tuple[T, int]:
    import psycopg

    from conduit_core.storage._postgres import _PgCx

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("BEGIN")
        result = read(_PgCx(cur))
        index = cur.execute(_PG_TUPLES).fetchone()
        heap = cur.execute(_PG_HEAP).fetchone()
        cur.execute("ROLLBACK")
    assert index is not None
    assert heap is not None
    return result, int(index[0]) + int(heap[0])


def _analyze(url: str) -> None:
    """Planner statistics, as autovacuum keeps them on a store with history (a young store's
    are gathered by the daemon: ``tests/daemon/test_planner_statistics.py``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE conduit_work")
