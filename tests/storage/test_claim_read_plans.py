"""A claim's read of the ready queue is planned once per connection, and never JIT-compiled
however deep the queue (issue 32).

PostgreSQL plans a prepared statement with parameters afresh at each execution while it finds
that cheaper than its generic plan, and it did for this read: ~0.2 ms of planning a claim, with
the limit's row locked. Its values (the claimer's limits, pools and batch size) are written into
the statement, which has no parameters left: planned once (``pg_prepared_statements``).

No statement the store sends is JIT-compiled either.

A claim's read of the ready queue is sized by the free slots, counted by the statement itself,
so the planner cannot know its row count and takes a tenth of the queue. Under a backlog of
tens of thousands its estimated cost passes the server's ``jit_above_cost`` (100,000 by
default), and with JIT on every claim compiled its plan first: ~35 ms for a read that runs in
0.1 ms, with the limit's row locked, so every other claim waited too (``bench_daemon.py --mode
backlog --depth 30000``: ~10 jobs/s for 10-15 s, found with ``auto_explain``). The store's
connections run with JIT off.

The estimated cost a given depth reaches depends on the statistics of the moment, so the test
does not build a queue deep enough for the default threshold: it lowers the database's
threshold below what its own queue's read is estimated to cost, which is the same condition.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conduit_core.storage import CapacityLimits, open_store
from conduit_core.storage._admission import NoBudgets
from conduit_core.storage._ready_reads import read_at_once_sql
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot

pytestmark = pytest.mark.anyio

BACKLOG = 2_000
#: A daemon's usual limits: every binding in the global limit.
LIMITS = CapacityLimits(global_limit=8, binding_pools={"b": None})


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_claim_read_costed_past_the_jit_threshold_is_not_compiled(
    store_url: str,
) -> None:
    sql, params = read_at_once_sql(LIMITS, None, 64)  # the daemon's claim asks for 64
    assert params == ()  # every value written in: the statement runs as it is anywhere
    async with await open_store(store_url) as store:
        await store.create_works(
            [(make_work(f"w{i:05}"), make_input(f"in{i:05}")) for i in range(BACKLOG)]
        )
        # Four attempts hold slots, as in a running daemon: the read still has room for four.
        claims, _ = await store.admit_ready(
            limit=4, snapshot_for=lambda work: snapshot(), max_inputs=None, owner="o",
            now_ms=T0, lease_ms=30_000, capacity=LIMITS, budgets=NoBudgets(), gates=None,
        )  # fmt: skip
        assert len(claims) == 4
    with psycopg.connect(store_url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_jit_available()").fetchone() == (True,)
        conn.execute("ANALYZE")
        # What the read is estimated to cost on this queue, planned as the server would.
        planned = _plan(conn.execute("EXPLAIN (FORMAT JSON) " + sql))
        cost = planned["Plan"]["Total Cost"]
        # A server whose threshold this queue's read passes (as a deep one passes 100,000):
        # a fresh connection of its own compiles that read.
        database = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{database}" SET jit_above_cost = {cost / 2}')
        conn.execute(f'ALTER DATABASE "{database}" SET jit_inline_above_cost = -1')
        conn.execute(f'ALTER DATABASE "{database}" SET jit_optimize_above_cost = -1')
    with psycopg.connect(store_url, autocommit=True) as conn:
        compiled = _plan(conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql))
        assert "JIT" in compiled, "the condition of the defect does not hold"

    async with await open_store(store_url) as store:

        def explained(cx: Any) -> dict[str, Any]:
            (row,) = cx.rows("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            return _plan([row])

        plan = store.transaction(explained)  # type: ignore[attr-defined]
    # The store's own connection runs the read with nothing compiled, and it found the rows.
    assert "JIT" not in plan, plan.get("JIT")
    assert plan["Plan"]["Actual Rows"] == 4


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_claim_read_is_planned_once_per_connection(store_url: str) -> None:
    limits = CapacityLimits(
        global_limit=50, pool_limits={"p": 40}, binding_pools={"b": None}, skip_bindings=("c",)
    )
    sql, params = read_at_once_sql(limits, None, 1)
    assert params == ()  # every value written in
    async with await open_store(store_url) as store:
        await store.create_works(
            [(make_work(f"w{i:02}"), make_input(f"in{i:02}")) for i in range(10)]
        )
        for _ in range(8):  # one claim at a time, each on one of the store's connections
            claims, _ = await store.admit_ready(
                limit=1, snapshot_for=lambda work: snapshot(), max_inputs=None, owner="o",
                now_ms=T0, lease_ms=30_000, capacity=limits, budgets=NoBudgets(), gates=None,
            )  # fmt: skip
            assert len(claims) == 1

        def plans(cx: Any) -> list[tuple[int, int]]:
            return [
                (int(generic), int(custom))
                for generic, custom in cx.rows(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement = ?", (sql,)
                )
            ]

        found = store.transaction(plans)  # type: ignore[attr-defined]
    # A connection that ran claims planned their read once, generically, and used that plan
    # for each (with parameters, PostgreSQL plans at least the first five afresh).
    assert found, "the read is not prepared on the connection asked"
    ((generic, custom),) = found
    assert custom == 0
    assert generic >= 1


def _plan(rows: Any) -> dict[str, Any]:
    (row,) = list(rows)
    value = row[0]
    plan = value if isinstance(value, list) else json.loads(value)
    return plan[0]
