"""The queue's gauges from the ready Work's index alone, exactly what a read of every ready row
gives (issue 32: "queue depth and wait time without scans").

``ready_depth``, ``ready_summary``, ``capacity_waiting`` and ``work_counts``' ``startable`` read
the groups of ready Work (binding, scope: how many, the oldest ``ready_since``) from the partial
index ``conduit_work_ready_binding`` and take out the few waiting for an unconfirmed stop, found
from the attempts holding a slot. Here some of those blocked Work are the oldest of their group,
one is its group's only Work, and one group's blocked Work is not its oldest; every figure must
match the row-by-row reference (the statements the gauges ran before schema V16). The index's
plan is read too: an index-only scan on both stores, no row's page.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio.to_thread
import msgspec
import pytest

from conduit_core.storage import CapacityLimits, SqlStore, Store
from conduit_core.storage.conformance import T0, make_input, make_work

pytestmark = pytest.mark.anyio

UNBLOCKED = (
    "NOT EXISTS (SELECT 1 FROM conduit_execution x "
    "WHERE x.work_id = conduit_work.id AND x.holds_slot = 1)"
)
REFERENCE = (
    "SELECT binding, scope, COUNT(*), MIN(ready_since) FROM conduit_work "
    f"WHERE claimable = 1 AND {UNBLOCKED} GROUP BY binding, scope"
)

#: (work id, binding, scope): created in this order, so each is older than the next.
WORK = [
    ("a1", "alpha", "root"), ("a2", "alpha", "root"), ("a3", "alpha", "root"),
    ("a4", "alpha", "team"), ("b1", "beta", "root"), ("b2", "beta", "root"),
    ("c1", "gamma", "root"), ("d1", "delta", "team"), ("d2", "delta", "team"),
]  # fmt: skip
#: Ready, with an earlier attempt still holding its slot (an unconfirmed stop): not startable.
#: a1 and a2: the two oldest of their group; c1: its group's only Work; d2: not its oldest.
BLOCKED = ["a1", "a2", "c1", "d2"]


async def _sql(store: Store, *statements: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Run ``statements`` in one transaction; the last one's rows."""
    assert isinstance(store, SqlStore)

    def run(cx: Any) -> list[Any]:
        *before, last = statements
        for sql in before:
            cx.run(sql)
        if last.lstrip().upper().startswith(("SELECT", "EXPLAIN")):
            return [tuple(row) for row in cx.rows(last, params)]
        cx.run(last, params)
        return []

    return await anyio.to_thread.run_sync(lambda: store.transaction(run))


async def _fill(store: Store) -> None:
    for n, (work_id, binding, scope) in enumerate(WORK):
        work = make_work(work_id, scope=scope)
        work = msgspec.structs.replace(work, binding=binding, created_at_ms=T0 + n)
        await store.create_work(work, first_input=make_input(f"{work_id}-in"))
        await _sql(store, "UPDATE conduit_work SET ready_since = ? WHERE id = ?",
                   params=(T0 + n, work_id))
    for work_id in BLOCKED:
        await _sql(
            store,
            "INSERT INTO conduit_execution "
            "(id, work_id, attempt, epoch, status, live, holds_slot, pool, scope, data) "
            "VALUES (?, ?, 1, 1, 'failed', 0, 1, NULL, 'root', '{}')",
            params=(f"stop-{work_id}", work_id),
        )


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_the_gauges_match_a_read_of_every_ready_row(store: Store, store_url: str) -> None:
    await _fill(store)
    reference = {(b, s): (int(n), int(oldest)) for b, s, n, oldest in await _sql(store, REFERENCE)}
    assert reference == {  # the reference itself, as the blocked Work make it
        ("alpha", "root"): (1, T0 + 2), ("alpha", "team"): (1, T0 + 3),
        ("beta", "root"): (2, T0 + 4), ("delta", "team"): (1, T0 + 7),
    }  # fmt: skip

    depth: Counter[str] = Counter()
    oldest: dict[str, int] = {}
    for (binding, _scope), (count, since) in reference.items():
        depth[binding] += count
        oldest[binding] = min(oldest.get(binding, since), since)
    assert await store.ready_depth() == dict(depth)
    assert await store.ready_summary() == {b: (depth[b], oldest[b]) for b in depth}
    assert (await store.work_counts())["startable"] == sum(depth.values()) == 5
    # Every binding in a full pool: every startable Work waits for it.
    full = CapacityLimits(pool_limits={"p": 0}, binding_pools={b: "p" for b in depth})
    assert await store.capacity_waiting(full) == {"p": 5}

    # Unblocked (their stops confirmed): every ready Work counts again.
    await _sql(store, "UPDATE conduit_execution SET holds_slot = 0")
    summary = await store.ready_summary()
    assert summary == {"alpha": (4, T0), "beta": (2, T0 + 4), "gamma": (1, T0 + 6),
                       "delta": (2, T0 + 7)}  # fmt: skip


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_the_groups_are_read_from_the_index_alone(store: Store, store_url: str) -> None:
    await _fill(store)
    groups = (
        "SELECT binding, scope, COUNT(*), MIN(ready_since) FROM conduit_work "
        "WHERE claimable = 1 GROUP BY binding, scope"
    )
    if store_url.startswith("sqlite"):
        # SQLite opens the table's cursor beside the index's either way; no column may be read
        # from it (before V16 ``ready_since`` was: a page read per ready row).
        (root,) = (await _sql(
            store, "SELECT rootpage FROM sqlite_master WHERE name = 'conduit_work'"
        ))[0]  # fmt: skip
        program = await _sql(store, "EXPLAIN " + groups)
        table = {op[2] for op in program if op[1] == "OpenRead" and op[3] == root}
        plan = " ".join(str(r[-1]) for r in await _sql(store, "EXPLAIN QUERY PLAN " + groups))
        assert "USING INDEX conduit_work_ready_binding" in plan, plan
        assert [op for op in program if op[1] == "Column" and op[2] in table] == []
        return
    # A tiny table, read as a big one is: not by a scan of the table.
    plan = "\n".join(
        str(row[0]) for row in await _sql(store, "SET LOCAL enable_seqscan = off", "EXPLAIN " + groups)
    )
    assert "Index Only Scan using conduit_work_ready_binding" in plan, plan
