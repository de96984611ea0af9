"""Every write transaction takes a limit's row before a budget ledger's, and one claim's limits
at most (PostgreSQL).

Claims from the ready queue lock their limit's counter row, then the ledgers they check. A
transaction that locked a ledger first and a limit after crossed that order: with another
daemon's claim holding the limit and waiting for the ledger, PostgreSQL found the deadlock
after ``deadlock_timeout`` (a second) and rolled one transaction back to be run again. Two ways
in were found (issue 32): a group-commit batch that ran ``charge_pending`` (the pass's charge of
staged usage) before its claim, and claims that charged staged usage before they locked their
limits: from the ready queue counting unknown pools (``sized_batch``), and of named Work
(``admit_attempts``: a Work let through by its start gates, say). And two claims in one batch,
each locking its own limits in name order, locked the two sets in the order they came: a claim
of named Work now shares its batch with no other claim, and where two claims from the ready
queue share one, a limit that comes before one the transaction holds is waited for only
briefly, past which the batch runs again (``_sql.lock_counter_rows``;
``conduit_store_retries_total{reason="lock_order"}``).

Each case is staged with a third connection holding the ledger's row, so that both
transactions are inside before either can take it; then the ledger is let go. The store
counts its retried transactions by reason (``conduit_store_retries_total``): no deadlock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from conduit_core.config import Budget
from conduit_core.runtime._budgets import BudgetBook
from conduit_core.storage import CapacityLimits, Claim, SqlStore, Store, open_store
from conduit_core.storage._admission import AdmitRequest, PendingUsage
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot
from conduit_core.telemetry import METRICS

pytestmark = pytest.mark.anyio

#: One ledger for every Work (``per = "all"``): each claim checks it, each charge takes it.
BOOK = BudgetBook([Budget(name="w", unit="widgets", max=1_000, per="all")], {})
(LEDGER,) = BOOK.ledgers("any", "root", None, T0)

#: Limits a claim locks before it reads the queue (every binding in one pool), and limits it
#: finds only from the Work it locked (counted first, locked after: ``sized_batch``).
ONE_POOL = CapacityLimits(pool_limits={"p": 8}, binding_pools={"b": "p"})
UNKNOWN_POOLS = CapacityLimits(global_limit=8)


def _retries(reason: str) -> float:
    value = METRICS.registry.get_sample_value("conduit_store_retries_total", {"reason": reason})
    return value or 0.0


def _deadlocks() -> float:
    return _retries("deadlock")


async def _stage_usage(store: Store, work_id: str) -> None:
    usage = PendingUsage(id=f"u-{work_id}", work_id=work_id, scope="root",
                         units={"widgets": 1.0}, staged_at_ms=T0)  # fmt: skip
    assert isinstance(store, SqlStore)

    def write(cx: Any) -> None:
        cx.run("INSERT INTO conduit_budget_pending (id, work_id, data) VALUES (?, ?, ?)",
               (usage.id, work_id, msgspec.json.encode(usage).decode()))  # fmt: skip

    await anyio.to_thread.run_sync(lambda: store.transaction(write))


def _admit(store: Store, capacity: CapacityLimits) -> Callable[[], Awaitable[Any]]:
    async def admit() -> Any:
        claims, _ = await store.admit_ready(
            limit=2, snapshot_for=lambda work: snapshot("p"), max_inputs=None, owner="o",
            now_ms=T0, lease_ms=30_000, capacity=capacity, budgets=BOOK, gates=None,
        )  # fmt: skip
        return claims

    return admit


def _admit_named(store: Store, capacity: CapacityLimits) -> Callable[[], Awaitable[Any]]:
    async def admit() -> Any:
        requests = [AdmitRequest(work_id=w, snapshot=snapshot("p")) for w in ("w0", "w1")]
        return await store.admit_attempts(
            requests, owner="o", now_ms=T0, lease_ms=30_000, capacity=capacity, budgets=BOOK,
            gates=None,
        )  # fmt: skip

    return admit


def _charge(store: Store) -> Callable[[], Awaitable[Any]]:
    async def charge() -> Any:
        return await store.settle_budgets(BOOK, now_ms=T0)

    return charge


@contextlib.contextmanager
def _ledger_held(url: str) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """An observer's connection, and a third party's holding the ledger's counter row until it
    rolls back."""
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url) as holder:
        holder.execute(
            "INSERT INTO conduit_counter (name, value) VALUES (%s, 0) "
            "ON CONFLICT (name) DO NOTHING", (f"budget:{LEDGER.key}",),
        )  # fmt: skip
        holder.commit()
        holder.execute(
            "SELECT name FROM conduit_counter WHERE name = %s FOR UPDATE",
            (f"budget:{LEDGER.key}",),
        )
        yield admin, holder


async def _lock_waiters(admin: psycopg.Connection[Any], count: int) -> None:
    """Wait until ``count`` of the database's backends wait for a row lock."""
    deadline = time.monotonic() + 10
    while True:
        (waiting,) = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone() or (0,)
        if waiting >= count:
            return
        assert time.monotonic() < deadline, f"{waiting} of {count} transactions wait for a lock"
        await anyio.sleep(0.01)


@pytest.mark.parametrize(
    ("capacity", "first_batch"),
    [(ONE_POOL, "charge_and_claim"), (UNKNOWN_POOLS, "claim"), (ONE_POOL, "named")],
    ids=["charge-batched-before-a-claim", "claim-of-unknown-pools", "claim-of-named-work"],
)
async def test_no_transaction_takes_a_ledger_before_a_limit(
    postgres_url: str, capacity: CapacityLimits, first_batch: str
) -> None:
    async with await open_store(postgres_url) as a, await open_store(postgres_url) as b:
        for i in range(4):
            await a.create_work(make_work(f"w{i}"), first_input=make_input(f"w{i}-in"))
        await _stage_usage(a, "w0")
        await _stage_usage(a, "w1")
        results: dict[str, Any] = {}
        before = _deadlocks()
        with _ledger_held(postgres_url) as (admin, holder):

            async def run(name: str, call: Callable[[], Awaitable[Any]]) -> None:
                results[name] = await call()

            async with anyio.create_task_group() as tg:
                with anyio.fail_after(20):
                    # Daemon A: its batch (the charge and the claim queued in one turn of the
                    # loop, so they share it), which waits for the held ledger.
                    if first_batch == "charge_and_claim":
                        tg.start_soon(run, "a_charge", _charge(a))
                    if first_batch == "named":
                        tg.start_soon(run, "a_claim", _admit_named(a, capacity))
                    else:
                        tg.start_soon(run, "a_claim", _admit(a, capacity))
                    await _lock_waiters(admin, 1)
                    # Daemon B's claim: it waits too (for the ledger, or for A's limit).
                    tg.start_soon(run, "b_claim", _admit(b, capacity))
                    await _lock_waiters(admin, 2)
                    holder.rollback()  # the ledger let go: both go on
        claimed = [
            c.work.id for name in ("a_claim", "b_claim") for c in results[name]
            if isinstance(c, Claim)
        ]  # fmt: skip
        assert sorted(claimed) == ["w0", "w1", "w2", "w3"]
        assert (await a.list_ledgers())[0].used == 2  # each staged usage charged once
        assert _deadlocks() == before, "a transaction took a ledger before a limit"


#: Two pools: a claim locks the limits of the pools it claims from, in name order.
TWO_POOLS = CapacityLimits(pool_limits={"p1": 8, "p2": 8}, binding_pools={"b1": "p1", "b2": "p2"})


def _pool_of(work: Any) -> Any:
    return snapshot("p1" if work.binding == "b1" else "p2")


def _admit_named_in(store: Store, work_id: str, pool: str) -> Callable[[], Awaitable[Any]]:
    async def admit() -> Any:
        return await store.admit_attempts(
            [AdmitRequest(work_id=work_id, snapshot=snapshot(pool))], owner="o", now_ms=T0,
            lease_ms=30_000, capacity=TWO_POOLS, budgets=BOOK, gates=None,
        )  # fmt: skip

    return admit


def _admit_ready_of_two_pools(store: Store) -> Callable[[], Awaitable[Any]]:
    async def admit() -> Any:
        claims, _ = await store.admit_ready(
            limit=1, snapshot_for=_pool_of, max_inputs=None, owner="o", now_ms=T0,
            lease_ms=30_000, capacity=TWO_POOLS, budgets=BOOK, gates=None,
        )  # fmt: skip
        return claims

    return admit


async def test_a_claim_of_named_work_and_a_ready_claim_never_lock_two_pools_in_two_orders(postgres_url: str) -> None:
    """A batch held a claim of named Work in one pool and a claim from the ready queue, which
    locks every pool with room: with another daemon's batch holding the same two kinds of claim
    the other way round (its named Work in the other pool), each held one pool's limit and waited
    for the other's. A claim of named Work now shares its batch with no other claim."""
    async with await open_store(postgres_url) as a, await open_store(postgres_url) as b:
        # A's claim from the ready queue takes w3 first (its priority), in p2; B's then w1, in p1.
        for i, binding in enumerate(("b1", "b1", "b2", "b2")):
            work = msgspec.structs.replace(
                make_work(f"w{i}"), binding=binding, priority=5 if i == 3 else 0
            )
            await a.create_work(work, first_input=make_input(f"w{i}-in"))
        await _stage_usage(a, "w0")
        await _stage_usage(a, "w2")
        results: dict[str, Any] = {}
        before = _deadlocks()
        with _ledger_held(postgres_url) as (admin, holder):

            async def run(name: str, call: Callable[[], Awaitable[Any]]) -> None:
                results[name] = await call()

            async with anyio.create_task_group() as tg:
                with anyio.fail_after(20):
                    # Daemon A: its named Work in p1 and a claim from the ready queue, queued
                    # in one turn of the loop (one batch, before the fix): it holds p1 and
                    # waits for the held ledger (the named Work's staged usage).
                    tg.start_soon(run, "a_named", _admit_named_in(a, "w0", "p1"))
                    tg.start_soon(run, "a_ready", _admit_ready_of_two_pools(a))
                    await _lock_waiters(admin, 1)
                    # Daemon B: the same the other way round, holding p2.
                    tg.start_soon(run, "b_named", _admit_named_in(b, "w2", "p2"))
                    tg.start_soon(run, "b_ready", _admit_ready_of_two_pools(b))
                    await _lock_waiters(admin, 2)
                    holder.rollback()  # the ledger let go: both go on
        claimed = [c.work.id for r in results.values() for c in r if isinstance(c, Claim)]
        assert {"w0", "w2"} <= set(claimed)  # the named Work
        # A claim from the ready queue may have skipped a row the other one held (SKIP LOCKED)
        # and come back short: what is left is claimed now, and nothing twice.
        claimed += [c.work.id for c in await _admit_ready_of_two_pools(a)()]
        claimed += [c.work.id for c in await _admit_ready_of_two_pools(a)()]
        assert sorted(claimed) == ["w0", "w1", "w2", "w3"]
        assert (await a.list_ledgers())[0].used == 2  # each staged usage charged once
        assert _deadlocks() == before, "two batches locked two pools' limits in two orders"


async def test_two_ready_claims_in_one_batch_never_wait_for_a_limit_out_of_order(
    postgres_url: str,
) -> None:
    """Two claims from the ready queue share a batch (a daemon's pass and the claim that joins a
    settlement), and each locks the limits of the Work it finds: A's first claim took p2 and its
    second then needed p1, while B's batch had taken p1 and waited for what A held. Each waited
    for the other until PostgreSQL's deadlock check (1 s). A limit that comes before one a
    transaction holds is now waited for 50 ms at most (``lock_counter_rows``): A fails then and
    runs again, once B is through."""
    async with await open_store(postgres_url) as a, await open_store(postgres_url) as b:
        # The ready queue's order: w3 (p2), w0 (p1), w1 (p1), w2 (p2).
        for i, (binding, priority) in enumerate((("b1", 8), ("b1", 7), ("b2", 6), ("b2", 9))):
            work = msgspec.structs.replace(make_work(f"w{i}"), binding=binding, priority=priority)
            await a.create_work(work, first_input=make_input(f"w{i}-in"))
        results: dict[str, Any] = {}
        deadlocks, out_of_order = _deadlocks(), _retries("lock_order")
        with _ledger_held(postgres_url) as (admin, holder):

            async def run(name: str, call: Callable[[], Awaitable[Any]]) -> None:
                results[name] = await call()

            async with anyio.create_task_group() as tg:
                with anyio.fail_after(20):
                    # Daemon A: two claims in one batch. The first takes w3 and p2's limit, then
                    # waits for the held ledger.
                    tg.start_soon(run, "a_first", _admit_ready_of_two_pools(a))
                    tg.start_soon(run, "a_second", _admit_ready_of_two_pools(a))
                    await _lock_waiters(admin, 1)
                    # Daemon B: its first claim takes w0 (w3 is A's) and p1's limit, and waits
                    # for the ledger too.
                    tg.start_soon(run, "b_first", _admit_ready_of_two_pools(b))
                    tg.start_soon(run, "b_second", _admit_ready_of_two_pools(b))
                    await _lock_waiters(admin, 2)
                    # The ledger let go: A takes it first, and its second claim finds w1, in
                    # p1, whose limit B holds while it waits for the ledger A now holds.
                    holder.rollback()
        claimed = [c.work.id for r in results.values() for c in r if isinstance(c, Claim)]
        # A claim may have skipped a row the other daemon held (SKIP LOCKED) and come back
        # short: what is left is claimed now, and nothing twice.
        for _ in range(2):
            claimed += [c.work.id for c in await _admit_ready_of_two_pools(a)()]
        assert sorted(claimed) == ["w0", "w1", "w2", "w3"]
        assert _deadlocks() == deadlocks, "two batches waited for two pools' limits in two orders"
        assert _retries("lock_order") > out_of_order, "the crossing was not staged"
