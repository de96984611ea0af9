"""A claim's read of the ready queue takes only the bindings its daemon starts, and costs what it
keeps, not the backlog (issue 32).

With one pool for every binding the read took Work of any binding, so the oldest ready Work of a
binding the daemon lacks filled it, pass after pass, and nothing else started
(``tests/daemon/test_unknown_binding.py`` runs that through a daemon). It is now filtered by the
daemon's bindings, as reads with more than one pool already were, but as an expression no index
serves: given the column, SQLite reads every ready row of those bindings through the binding
index and sorts them, where the walk of the ready index in claim order stops at its ``LIMIT``.

With more than one pool, each pool's read was filtered by the column, and SQLite paid exactly
that: 25 ms a claim at a backlog of 50,000, to keep four. SQLite then read each binding's oldest
through an index in claim order (``conduit_work_ready_order``, schema 17), one read per binding.

The walk had its own cost: every row of another binding queued ahead of the claimer's own was
passed by, at every claim (another daemon's backlog on a shared store: 28-30 ms a claim behind
50,000 of it, on either store). Every claim's read now goes through that index, one range per
binding (PostgreSQL too, schema 18: a lateral subquery per binding where one statement reads
several).

The cost is measured on the database's side (``_read_cost``) with a backlog of 100, then of
3,000, with Work of a binding no claimer here starts queued ahead of it all: 10, then 3,000.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from conduit_core.storage import CapacityLimits, open_store
from conduit_core.storage.conformance import make_input, make_work
from tests.storage._read_cost import read_cost, ready_ids

pytestmark = pytest.mark.anyio

#: A daemon whose bindings all count against one pool, and one with two pools.
ONE_POOL = CapacityLimits(global_limit=8, binding_pools={"a": None})
TWO_POOLS = CapacityLimits(global_limit=8, pool_limits={"p": 8},
                           binding_pools={"a": None, "b": "p"})  # fmt: skip
#: One pool for two bindings, and for twelve (each store reads them in one statement).
TWO_BINDINGS = CapacityLimits(global_limit=8, binding_pools={"a": None, "c": None})
TWELVE = CapacityLimits(
    global_limit=8, binding_pools={"a": None, "c": None, **{f"m{n}": None for n in range(10)}}
)


async def _add(store: Any, binding: str, first: int, count: int, *, priority: int = 0) -> None:
    await store.create_works([
        (msgspec.structs.replace(make_work(f"{binding}{n:05}"), binding=binding,
                                 priority=priority), make_input(f"{binding}{n:05}"))
        for n in range(first, first + count)
    ])  # fmt: skip


@pytest.mark.parametrize(
    "capacity",
    [ONE_POOL, TWO_POOLS, TWO_BINDINGS, TWELVE],
    ids=["one-pool", "two-pools", "two-bindings", "twelve-bindings"],
)
@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_a_claim_reads_its_own_bindings_as_far_as_it_keeps(
    store_url: str, capacity: CapacityLimits
) -> None:
    async with await open_store(store_url) as store:
        # Oldest of all (their priority): Work of a binding no claimer here starts.
        await _add(store, "z", 0, 10, priority=5)
        await _add(store, "a", 0, 100)
        await _add(store, "c", 0, 10)  # younger than every "a"
        small, small_cost = read_cost(store_url, ready_ids(capacity))
        await _add(store, "z", 10, 2_990, priority=5)
        await _add(store, "a", 100, 2_900)
        large, large_cost = read_cost(store_url, ready_ids(capacity))
    assert small == large == ["a00000", "a00001", "a00002", "a00003"]
    assert large_cost <= small_cost * 2 + 20, (small_cost, large_cost)
