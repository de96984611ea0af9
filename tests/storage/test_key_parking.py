"""Ready Work of a concurrency key at its limit is parked, out of the claim's read (issue 32).

A claim read the ready queue in claim order and passed by the Work of a key at its limit row by
row (``_keys.READY_KEY_FILTER``), so a key with a backlog and its slot held cost every claim a
pass over that backlog (20 ms on SQLite, 43 ms on PostgreSQL behind 20,000). Such Work is now
parked as it becomes ready (``_key_parking``), unparked, oldest first, by the write that frees
a place of its key, and by the daemon's sweep (``Store.unpark_keys``) where a racing write
could not see it. Both backends, through the store's public operations; the read's cost is
measured on the database's side (``_read_cost``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from conduit_core.model import ExecutionStatus, Work, WorkStatus
from conduit_core.storage import CapacityLimits, Claim, ClaimRequest, open_store
from conduit_core.storage._contract import AttemptEnd
from conduit_core.storage.conformance import T0, make_input, snapshot
from tests.storage._keyed import in_transaction, keyed_work, parked_ids
from tests.storage._read_cost import read_cost, ready_ids
from tests.storage._undo import UNDO_V20

pytestmark = pytest.mark.anyio

#: A daemon's limits: its one binding (``b``) in the global pool, keys enforced.
LIMITS = CapacityLimits(global_limit=100, binding_pools={"b": None}, concurrency_keys=True)



async def _submit(store: Any, *works: Work) -> None:
    """One by one, as ``POST /v1/work`` does (the Work becomes ready with its first input)."""
    for work in works:
        await store.create_work(work, first_input=make_input(f"{work.id}-in"))




async def _claim(store: Any, limit: int = 10) -> list[Claim]:
    outcomes = await store.claim_ready(
        limit=limit, snapshot_for=lambda work: snapshot(), owner="o", now_ms=T0 + 10,
        lease_ms=60_000, capacity=LIMITS,
    )  # fmt: skip
    return [c for c in outcomes if isinstance(c, Claim)]


async def _complete(store: Any, claim: Claim) -> None:
    end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True)
    await store.finish_attempt(
        claim.lease, end, now_ms=T0 + 20,
        work=lambda w: msgspec.structs.replace(w, status=WorkStatus.COMPLETED),
    )  # fmt: skip


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_a_claim_reads_past_none_of_a_full_keys_backlog(store_url: str) -> None:
    """Key ``k`` (limit 1) holds its slot; its backlog, queued ahead of 100 Work without a key,
    grows from 10 to 3,000. The claim's read returns the same four Work and costs about the same
    (on the code before, SQLite's steps and PostgreSQL's tuples grew with the backlog)."""
    async with await open_store(store_url) as store:
        await _submit(store, keyed_work("k-head", "k", at=T0 - 10_000))
        (holder,) = await _claim(store)
        assert holder.work.id == "k-head"

        async def backlog(first: int, count: int) -> None:
            await store.create_works([
                (keyed_work(f"k{n:05}", "k", at=T0 - 5_000 + n), make_input(f"k{n:05}"))
                for n in range(first, first + count)
            ])  # fmt: skip

        await backlog(0, 10)
        await store.create_works([
            (keyed_work(f"free{n:03}", None, at=T0 + n), make_input(f"free{n:03}")) for n in range(100)
        ])  # fmt: skip
        small, small_cost = read_cost(store_url, ready_ids(LIMITS))
        await backlog(10, 2_990)
        assert len(await parked_ids(store)) == 3_000
        large, large_cost = read_cost(store_url, ready_ids(LIMITS))
    assert small == large == ["free000", "free001", "free002", "free003"]
    assert large_cost <= small_cost * 2 + 20, (small_cost, large_cost)


async def test_a_keys_work_runs_in_order_within_its_limit(store_url: str) -> None:
    """Six Work of ``k`` (limit 2), submitted one by one: the last four are parked. Each ended
    attempt unparks the oldest parked, so the claims take them in order, never more than two
    live, and all six run."""
    async with await open_store(store_url) as store:
        await _submit(store, *(keyed_work(f"w{n}", "k", 2, at=T0 + n) for n in range(6)))
        assert await parked_ids(store) == ["w2", "w3", "w4", "w5"]
        live = await _claim(store)
        order = [c.work.id for c in live]
        assert order == ["w0", "w1"]
        while live:
            await _complete(store, live.pop(0))
            more = await _claim(store)
            assert len(live) + len(more) <= 2
            live += more
            order += [c.work.id for c in more]
        assert order == [f"w{n}" for n in range(6)]
        assert await parked_ids(store) == []


async def test_a_higher_priority_work_of_a_key_still_goes_first(store_url: str) -> None:
    """``low`` is ready and unparked when ``high`` (five points of priority, so ahead of it in
    claim order) arrives: ``high`` is not parked behind it, and starts first, as it did before
    anything was parked; ``later`` is parked behind both. All three start, one at a time."""
    async with await open_store(store_url) as store:
        await _submit(store, keyed_work("low", "k", at=T0), keyed_work("high", "k", at=T0 + 1, priority=5),
                      keyed_work("later", "k", at=T0 + 2))  # fmt: skip
        assert await parked_ids(store) == ["later"]
        order: list[str] = []
        while len(order) < 3:
            (claim,) = await _claim(store)
            order.append(claim.work.id)
            await _complete(store, claim)
        assert order == ["high", "low", "later"]


async def test_a_ready_work_cancelled_unparks_the_next(store_url: str) -> None:
    """``w0`` is ready (no attempt yet), ``w1`` and ``w2`` parked behind it. Cancelling ``w0``
    frees its place in the key: ``w1`` is unparked and claimed, ``w2`` stays parked."""
    async with await open_store(store_url) as store:
        await _submit(store, *(keyed_work(f"w{n}", "k", at=T0 + n) for n in range(3)))
        assert await parked_ids(store) == ["w1", "w2"]
        await store.cancel_work("w0", now_ms=T0 + 5)
        assert await parked_ids(store) == ["w2"]
        assert [c.work.id for c in await _claim(store)] == ["w1"]


async def test_a_batch_parks_its_work_beyond_the_keys_room(store_url: str) -> None:
    """A bulk submit decides for its own rows: of 50 Work of ``k`` (limit 3), one of which is
    already ready, the two oldest of the batch stay unparked, by claim order, not batch order."""
    async with await open_store(store_url) as store:
        await _submit(store, keyed_work("first", "k", 3, at=T0))
        batch = [keyed_work(f"b{n:02}", "k", 3, at=T0 + 100 - n) for n in range(50)]
        await store.create_works([(w, make_input(w.id)) for w in batch])
        parked = await parked_ids(store)
        assert len(parked) == 48
        assert {"b49", "b48"}.isdisjoint(parked)  # the oldest two (earliest ready)
        assert [c.work.id for c in await _claim(store)] == ["first", "b49", "b48"]


async def test_the_sweep_unparks_what_a_racing_write_left_parked(store_url: str) -> None:
    """Five keys, each with only parked Work and no slot holder (what a parking that committed
    beside the write freeing the key leaves): nothing is claimable until the sweep, which reads
    the keys two at a time and unparks each key's oldest."""
    async with await open_store(store_url) as store:
        await _submit(store, *(
            keyed_work(f"{key}-{n}", key, at=T0 + n) for key in "abcde" for n in range(2)
        ))  # fmt: skip
        await in_transaction(store, lambda cx: cx.run(
            "UPDATE conduit_work SET key_parked = 1 WHERE concurrency_key IS NOT NULL"))  # fmt: skip
        assert await _claim(store) == []
        pages = []
        unparked, after = await store.unpark_keys(after=None, scan=2)
        pages.append((unparked, after))
        while after is not None:
            unparked, after = await store.unpark_keys(after=after, scan=2)
            pages.append((unparked, after))
        assert pages == [(2, "b"), (2, "d"), (1, None)]
        claimed = sorted(c.work.id for c in await _claim(store))
        assert claimed == ["a-0", "b-0", "c-0", "d-0", "e-0"]
        # Each key is at its limit again: the sweep finds nothing to unpark.
        assert await store.unpark_keys(after=None, scan=10) == (0, None)


async def test_a_claim_by_id_of_a_parked_work_still_counts_the_key(store_url: str) -> None:
    """Parking keeps Work out of the ready read only: a claim by id (a recovery, a retry now)
    of a parked Work is decided by the key's locked count, as before."""
    async with await open_store(store_url) as store:
        await _submit(store, *(keyed_work(f"w{n}", "k", at=T0 + n) for n in range(2)))
        assert await parked_ids(store) == ["w1"]
        outcomes = await store.claim_attempts(
            [ClaimRequest(work_id="w1", snapshot=snapshot())], owner="o", now_ms=T0,
            lease_ms=60_000, capacity=LIMITS,
        )  # fmt: skip
        assert isinstance(outcomes[0], Claim)  # no holder yet: the key has room
        assert await _claim(store) == []  # w0: the key's one slot is taken


#: Schemas 20 and 19 undone: the store an earlier conduit left (its key backlog walked).
UNDO_V19 = (
    *UNDO_V20,
    "DROP INDEX conduit_work_key_ready",
    "DROP INDEX conduit_work_key_parked",
    "DROP INDEX conduit_work_ready_order",
    "ALTER TABLE conduit_work DROP COLUMN key_parked",
    "CREATE INDEX conduit_work_ready_order ON conduit_work (binding, ready_since, id) "
    "WHERE claimable = 1",
    "UPDATE conduit_meta SET value = '18' WHERE key = 'schema_version'",
)


async def test_an_upgraded_stores_key_backlog_is_parked_and_swept_back(store_url: str) -> None:
    """A store of schema 18 with three ready Work of ``k`` (limit 1) and one without a key:
    the upgrade parks the key's three, the sweep unparks the oldest, and claims take it and the
    keyless one, then the next of ``k`` once the first has ended."""
    async with await open_store(store_url) as store:
        await _submit(store, *(keyed_work(f"w{n}", "k", at=T0 + n) for n in range(3)),
                      keyed_work("free", None, at=T0 + 9))  # fmt: skip
        for statement in UNDO_V19:
            await in_transaction(store, lambda cx, sql=statement: cx.run(sql))
    async with await open_store(store_url) as store:  # migrates 18 -> 19
        assert await parked_ids(store) == ["w0", "w1", "w2"]
        assert [c.work.id for c in await _claim(store)] == ["free"]
        assert await store.unpark_keys(after=None, scan=10) == (1, None)
        (first,) = await _claim(store)
        assert first.work.id == "w0"
        await _complete(store, first)
        assert [c.work.id for c in await _claim(store)] == ["w1"]


async def test_a_keyed_settlement_sends_one_unpark(sqlite_url: str) -> None:
    """An attempt's settlement frees its key's place once: the attempt's own write (its slot
    no longer held) unparks the next Work. The write of its Work, which was running and not in
    the ready queue, frees no place, and sends no second unpark (it did until 7 Dec, a
    statement per keyed settlement that changed nothing)."""
    async with await open_store(sqlite_url) as store:
        await _submit(store, *(keyed_work(f"w{n}", "k", at=T0 + n) for n in range(3)))
        (claim,) = await _claim(store)
        sent: list[str] = []
        store._conn.set_trace_callback(sent.append)
        try:
            await _complete(store, claim)
        finally:
            store._conn.set_trace_callback(None)
        unparks = [sql for sql in sent if sql.startswith("UPDATE conduit_work SET key_parked = 0")]
        assert len(unparks) == 1, unparks
        assert await parked_ids(store) == ["w2"]
