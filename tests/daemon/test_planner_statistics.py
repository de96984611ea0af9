"""The daemon refreshes a young PostgreSQL store's planner statistics itself (issue 32): a
store filled from empty is analyzed seconds after it outgrew its statistics, not at
autovacuum's first look a minute later (``StatisticsUpkeep``, ``Store.refresh_statistics``)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from conduit_core.http import BatchSubmitRequest, BatchSubmitResult, SubmitRequest
from conduit_core.storage._pg_statistics import MIN_ROWS
from tests.daemon.conftest import Daemon, wait_for


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_the_daemon_analyzes_tables_that_outgrew_their_statistics(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    daemon = make_daemon().start()
    with psycopg.connect(store, autocommit=True) as conn:  # only the daemon may analyze them
        for table in ("conduit_work", "conduit_event"):
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    for batch in range(2):
        items = [SubmitRequest(binding="echo", id=f"b{batch}-{i:04}") for i in range(MIN_ROWS)]
        result = daemon.api().request(
            "POST", "/v1/work/batch", BatchSubmitRequest(items=items), BatchSubmitResult
        )
        assert result.created == MIN_ROWS

    def described() -> dict[str, float] | None:
        with psycopg.connect(store, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)",
                (["conduit_work", "conduit_event"],),
            ).fetchall()
        counts = {name: float(count) for name, count in rows}
        return counts if all(c >= MIN_ROWS for c in counts.values()) else None

    counts = wait_for("the daemon to analyze its young tables", described, timeout=30)
    assert set(counts) == {"conduit_work", "conduit_event"}
    logged = [line for line in daemon.log().splitlines() if "planner statistics refreshed" in line]
    assert logged, daemon.log()[-2000:]
    assert all(name in " ".join(logged) for name in counts), logged
