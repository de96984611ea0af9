"""Event sequence numbers: continued across the upgrade, and no queue of submitters on PostgreSQL.

PostgreSQL numbers events from a sequence (schema V5) instead of the ``event_seq`` counter row,
whose row lock made every transaction that accepted input wait for the one before to commit.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import anyio.to_thread
import psycopg
import pytest

from conduit_core.model import Event, WorkKind
from conduit_core.storage import open_store
from conduit_core.storage.conformance import T0, make_work
from tests.storage.test_binding_column import UNDO_V6

pytestmark = pytest.mark.anyio


def _event(n: int, work_id: str) -> Event:
    return Event(
        id=f"e{n}", delivery_id=f"d{n}", type="t", work_id=work_id, pending=True, accepted_at_ms=T0
    )


# A V4 store numbered events from this counter row.
_UPSERT = (
    "INSERT INTO conduit_counter (name, value) VALUES ('event_seq', %s) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)


def _downgrade_to_v4(store_url: str, counter: int) -> None:
    """Make the store look like one a V4 conduit left, its counter at ``counter``."""
    if store_url.startswith("sqlite://"):
        import sqlite3

        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            for statement in UNDO_V6:
                conn.execute(statement)
            conn.execute(_UPSERT.replace("%s", "?"), (counter,))
            conn.execute("UPDATE conduit_meta SET value = '4' WHERE key = 'schema_version'")
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        for statement in UNDO_V6:
            conn.execute(statement)
        conn.execute("DROP SEQUENCE conduit_event_seq")
        conn.execute(_UPSERT, (counter,))
        conn.execute("UPDATE conduit_meta SET value = '4' WHERE key = 'schema_version'")


async def test_numbers_continue_after_the_upgrade(store_url: str) -> None:
    store = await open_store(store_url)
    try:
        await store.create_work(make_work("w", kind=WorkKind.STANDING))
        first = await store.accept_event(_event(1, "w"))
    finally:
        await store.aclose()
    _downgrade_to_v4(store_url, counter=first.seq + 40)
    store = await open_store(store_url)  # migrates V4 -> current
    try:
        later = [await store.accept_event(_event(n, "w")) for n in (2, 3)]
        assert [e.seq for e in later] == [first.seq + 41, first.seq + 42]
        pending = await store.pending_inputs("w")
        assert [e.id for e in pending] == ["e1", "e2", "e3"]
    finally:
        await store.aclose()


def _accept_in_open_transaction(url: str, work_id: str) -> Iterator[int]:
    """Accept input for ``work_id`` in a transaction of its own and hold it open (yield)."""
    from conduit_core.storage import _ops_work
    from conduit_core.storage._postgres import _PgCx

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        stored = _ops_work.accept_event(_PgCx(cur), _event(100, work_id))
        yield stored.seq
        cur.execute("COMMIT")


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_postgres_submitters_do_not_wait_for_each_other(store_url: str) -> None:
    store = await open_store(store_url)
    try:
        for work_id in ("a", "b"):
            await store.create_work(make_work(work_id, kind=WorkKind.STANDING))
        holder = _accept_in_open_transaction(store_url, "a")
        held_seq = await anyio.to_thread.run_sync(next, holder)  # uncommitted input for "a"
        done = anyio.Event()
        accepted: list[Event] = []

        async def accept_other() -> None:
            accepted.append(await store.accept_event(_event(200, "b")))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(accept_other)
            # A counter row lock would hold the other Work's input until "a" commits.
            with anyio.move_on_after(5):
                await done.wait()
            finished_first = done.is_set()
            await anyio.to_thread.run_sync(next, holder, None)  # commit "a" (unblocks it)
        assert finished_first, "input for another Work waited for an open transaction"
        assert accepted[0].seq > held_seq
        assert [e.id for e in await store.pending_inputs("a")] == ["e100"]
    finally:
        await store.aclose()


async def test_blocks_of_numbers_come_from_the_same_source(store_url: str) -> None:
    """A block (a batch of fires' first inputs) and single accepts never reuse a number."""
    from conduit_core.storage._sql import next_event_seqs

    store = await open_store(store_url)
    try:
        await store.create_work(make_work("w", kind=WorkKind.STANDING))
        one = (await store.accept_event(_event(1, "w"))).seq
        block = store.transaction(lambda cx: next_event_seqs(cx, 3))  # type: ignore[attr-defined]
        two = (await store.accept_event(_event(2, "w"))).seq
        assert block == sorted(block)
        assert len(set(block)) == 3
        assert one < block[0]
        assert block[-1] < two
    finally:
        await store.aclose()
