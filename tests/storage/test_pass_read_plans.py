"""The reads every host-loop pass makes stay index reads on SQLite, never a walk of the
attempt table (which holds every attempt ever finished until GC).

``unconfirmed_exclusions`` once sorted by ``id`` in SQL, and SQLite then walked the whole
attempt table in primary-key order on every pass instead of the slot holders its partial index
lists: at 700 jobs/s the daemon's passes slowed as the table grew.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_core.storage import open_store_sync
from conduit_core.storage._sqlite import SqliteStore

NOW = 1_000_000


@pytest.mark.anyio
async def test_every_pass_read_of_the_attempt_table_uses_an_index(tmp_path: Path) -> None:
    store = open_store_sync(tmp_path / "conduit.db")
    assert isinstance(store, SqliteStore)
    statements: list[str] = []
    try:
        reader = store._reading()
        reader.conn.set_trace_callback(statements.append)
        await store.unconfirmed_exclusions()
        await store.expired_attempts(now_ms=NOW)
        await store.due_timers(now_ms=NOW)
        await store.next_timer_due()
        await store.open_controls()
        reader.conn.set_trace_callback(None)
        selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 5, statements
        for sql in selects:
            plan = " | ".join(
                row[3] for row in reader.conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
            )
            walks = [step for step in plan.split(" | ") if step.startswith("SCAN conduit_execution")
                     and "conduit_execution_slot" not in step]  # fmt: skip
            assert not walks, f"{sql}\n  plan: {plan}"
    finally:
        store.close()
