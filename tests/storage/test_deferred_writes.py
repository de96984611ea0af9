"""A settlement's writes are deferred (``Cx.defer``): a batch's go as one statement per kind.

A settlement has locked its attempt (which carries its lease) and Work when it writes them (and only its holder
inserts the attempt's pending-usage row), so on PostgreSQL those writes are held and sent with the transaction's next other statement or its commit, the
held rows of one kind as one set-based statement. Nothing the transaction does next may tell:
a read sees the held writes, a second write of a row lands after the first, a rolled-back
transaction writes none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import pytest

from conduit_core.extension import OutcomeKind, Result, Usage
from conduit_core.model import ExecutionStatus, Work, WorkStatus
from conduit_core.storage import AttemptEnd, Claim, Settlement, Store, open_store
from conduit_core.storage._admission import NoBudgets
from conduit_core.storage._ops_budgets import _DROP_STAGED, _STAGE_USAGE
from conduit_core.storage._ops_work import SAVE_CLAIMED_WORK
from conduit_core.storage._sql import (
    INSERT_LEASED_EXECUTION,
    SAVE_EXECUTION,
    SAVE_WORK,
    SetWrite,
    execution_params,
)
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot
from tests.storage.conftest import claimed_known

pytestmark = pytest.mark.anyio
T = TypeVar("T")


def _set_from() -> int:
    from conduit_core.storage._sql import ONE_STATEMENT_FROM

    return ONE_STATEMENT_FROM


def _sent(monkeypatch: pytest.MonkeyPatch, store_url: str) -> list[str]:
    """Every statement the store sends from now on (PostgreSQL; SQLite: none recorded)."""
    sent: list[str] = []
    if not store_url.startswith("postgresql"):
        return sent
    from conduit_core.storage._postgres import _PgCx

    execute = _PgCx._execute

    def recorded(self: Any, sql: str, params: Any, *, many: bool = False) -> Any:
        sent.append(sql)
        return execute(self, sql, params, many=many)

    monkeypatch.setattr(_PgCx, "_execute", recorded)
    return sent


def _each_sent_once(store_url: str, sent: list[str], *writes: SetWrite) -> None:
    """Each write went as its one set-based statement, none row by row (PostgreSQL; SQLite runs
    each row, and nothing is recorded there)."""
    if not store_url.startswith("postgresql"):
        return
    for write in writes:
        assert sent.count(write.many) == 1, f"not one statement for the batch: {write.many}"
        assert sent.count(write.one) == 0


async def test_a_batch_of_settlements_sends_each_kind_of_write_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = _set_from() + 1
    async with await open_store(store_url) as store:
        claims = [await claimed_known(store, f"w{i}") for i in range(count)]
        sent = _sent(monkeypatch, store_url)
        # Usage to stage: the settlement inserts a pending-usage row too (as a shell job's does).
        used = Result(outcome=OutcomeKind.COMPLETED, usage=Usage(units={"runs": 1.0}))

        async def settle(claim: Any) -> None:
            await store.settle_attempt(
                claim.lease,
                lambda ex, w: Settlement(
                    end=AttemptEnd(
                        status=ExecutionStatus.COMPLETED, exclusion_confirmed=True, result=used
                    ),
                    work=lambda w: w,
                ),
                now_ms=T0 + 2,
            )

        async with anyio.create_task_group() as tg:
            for claim in claims:
                tg.start_soon(settle, claim)
        for claim in claims:
            ended = await store.get_execution(claim.execution.id)
            assert ended.status is ExecutionStatus.COMPLETED
            assert ended.ended_at_ms == T0 + 2
            assert await store.get_lease(claim.execution.id) is None
            assert (await store.get_work(claim.work.id)).updated_at_ms == T0 + 2
        staged = {p.work_id: p.units for p in await store.pending_usage()}
        assert all(staged.get(c.work.id) == {"runs": 1.0} for c in claims), staged
        # Applied (here: dropped, budgets being off), the staged rows go in one statement.
        assert await store.settle_budgets(NoBudgets(), now_ms=T0 + 3) == count
        assert await store.pending_usage() == []
    _each_sent_once(
        store_url, sent, SAVE_EXECUTION, SAVE_WORK, _STAGE_USAGE, _DROP_STAGED
    )


@pytest.mark.parametrize("rows", ["set", "fewer"])
async def test_a_batch_of_claims_sends_each_kind_of_write_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch, rows: str
) -> None:
    """A claim batch's two writes (the attempt with its lease, the Work with its input floor,
    which consumes its input: no input row is written) go as one set-based statement each on
    PostgreSQL, not one per claim, and every claim's rows are as if alone.
    A batch of fewer rows sends one statement per row (all in one round trip): set-based, it
    cost PostgreSQL at c = 4 more than it saved."""
    count = _set_from() if rows == "set" else _set_from() - 1
    async with await open_store(store_url) as store:
        ids = [f"w{i}" for i in range(count)]
        for i, work_id in enumerate(ids):
            await store.create_work(make_work(work_id), first_input=make_input(str(i)))
        sent = _sent(monkeypatch, store_url)
        claims = await store.claim_ready(
            limit=count, snapshot_for=lambda w: snapshot(), owner="o", now_ms=T0 + 1,
            lease_ms=30_000,
        )  # fmt: skip
        assert sorted(c.work.id for c in claims if isinstance(c, Claim)) == ids
        for claim in claims:
            assert isinstance(claim, Claim)
            stored = await store.get_execution(claim.execution.id)
            assert (stored.attempt, stored.epoch, stored.status) == (1, 1, claim.execution.status)
            assert stored.status.live
            lease = await store.get_lease(claim.execution.id)
            assert lease is not None
            assert lease.token == claim.lease.token
            work = await store.get_work(claim.work.id)
            assert (work.status, work.last_attempt) == (WorkStatus.RUNNING, 1)
            assert [e.id for e in claim.inputs] == stored.inputs
            assert len(stored.inputs) == 1
            assert not await store.pending_inputs(claim.work.id), "the input stayed pending"
        assert not await store.ready_work(limit=10)
    if rows == "set":
        _each_sent_once(store_url, sent, INSERT_LEASED_EXECUTION, SAVE_CLAIMED_WORK)
    elif store_url.startswith("postgresql"):
        for write in (INSERT_LEASED_EXECUTION, SAVE_CLAIMED_WORK):
            assert (sent.count(write.one), sent.count(write.many)) == (1, 0), write.one


async def test_a_bulk_create_sends_one_statement_per_table(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Routine claim pass creates its fires' Work at once (``create_works``): on PostgreSQL
    the Work rows and their first inputs go as one set-based statement each; what is stored is
    as if created one by one (an id already taken refused, nothing written for it)."""
    from conduit_core.storage._ops_bulk import _INSERT_EVENT, _INSERT_WORK

    async with await open_store(store_url) as store:
        await store.create_work(make_work("taken"))
        sent = _sent(monkeypatch, store_url)
        count = _set_from()
        items = [(make_work(f"w{i}"), make_input(f"{i}")) for i in range(count)]
        results = await store.create_works([*items, (make_work("taken"), make_input("t"))])
        created = [r.id for r in results[:count] if isinstance(r, Work)]
        assert created == [f"w{i}" for i in range(count)]
        assert getattr(results[count], "code", None) == "work_exists"
        for i in range(count):
            work = await store.get_work(f"w{i}")
            assert work.pending_inputs == 1
            (pending,) = await store.pending_inputs(f"w{i}")
            assert pending.id == f"ev-{i}"
        assert not await store.pending_inputs("taken")
    _each_sent_once(store_url, sent, _INSERT_WORK, _INSERT_EVENT)


# --- The held writes as the transaction sees them (PostgreSQL) ---------------------------------

_DATA = "SELECT id, data FROM conduit_work ORDER BY id"


def _save(work_id: str, data: str) -> tuple[Any, ...]:
    return ("ready", "default", 0, T0, data, 0, T0, work_id)


async def _in_transaction(store: Store, fn: Callable[[Any], T], *, write: bool = True) -> T:
    run = partial(store.transaction, fn, write=write)  # type: ignore[attr-defined]
    return await anyio.to_thread.run_sync(run)


async def _read(store: Store) -> list[Any]:
    return await _in_transaction(store, lambda cx: cx.rows(_DATA), write=False)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("rows", [1, "set"])
async def test_postgres_held_writes_go_before_the_next_statement(
    store_url: str, rows: int | str
) -> None:
    n = _set_from() if rows == "set" else rows
    assert isinstance(n, int)
    async with await open_store(store_url) as store:
        for i in range(n):
            await store.create_work(make_work(f"w{i}"))
        ids = [f"w{i}" for i in range(n)]

        def held_then_read(cx: Any) -> list[Any]:
            for work_id in ids:
                cx.defer(SAVE_WORK, _save(work_id, f"first {work_id}"))
            cx.defer(SAVE_WORK, _save(ids[0], "second"))  # the same row again: after the first
            return cx.rows(_DATA)

        seen = await _in_transaction(store, held_then_read)
        expected = [("w0", "second")] + [(w, f"first {w}") for w in ids[1:]]
        assert [tuple(r) for r in seen] == expected, "a read did not see the held writes"

        def held_at_commit(cx: Any) -> None:
            for work_id in ids:
                cx.defer(SAVE_WORK, _save(work_id, f"committed {work_id}"))

        await _in_transaction(store, held_at_commit)
        committed = await _read(store)
        assert [tuple(r) for r in committed] == [(w, f"committed {w}") for w in ids]

        def held_then_refused(cx: Any) -> None:
            for work_id in ids:
                cx.defer(SAVE_WORK, _save(work_id, "rolled back"))
            raise RuntimeError("refused")

        with pytest.raises(RuntimeError, match="refused"):
            await _in_transaction(store, held_then_refused)
        after = await _read(store)
        assert [tuple(r) for r in after] == [tuple(r) for r in committed]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_postgres_a_row_held_twice_is_written_twice(store_url: str) -> None:
    """Two held writes of one attempt are two writes: its revision moves by two."""
    async with await open_store(store_url) as store:
        claim = await claimed_known(store, "w")
        rev = "SELECT rev FROM conduit_execution WHERE id = ?"
        (before,) = (await _in_transaction(store, lambda cx: cx.rows(rev, (claim.execution.id,))))[
            0
        ]

        def twice(cx: Any) -> None:
            p = execution_params(claim.execution)
            for _ in range(2):
                cx.defer(SAVE_EXECUTION, (p[3], p[4], p[5], p[6], p[9], p[5], claim.execution.id))

        await _in_transaction(store, twice)
        (after,) = (await _in_transaction(store, lambda cx: cx.rows(rev, (claim.execution.id,))))[0]
        assert after == before + 2


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_postgres_a_write_deferred_outside_a_pipelined_transaction_is_sent_at_once(
    store_url: str,
) -> None:
    """A cursor-level Cx (migrations) has no commit of its own to send held writes with."""
    import psycopg

    from conduit_core.storage._postgres import _PgCx

    async with await open_store(store_url) as store:
        await store.create_work(make_work("w0"))
    with psycopg.connect(store_url) as conn:
        with conn.transaction():
            _PgCx(conn.cursor()).defer(SAVE_WORK, _save("w0", "at once"))
        assert conn.execute("SELECT data FROM conduit_work WHERE id = 'w0'").fetchone() == (
            "at once",
        )
