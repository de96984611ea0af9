"""Releasing dedup and debounce key rows that name nothing any more, on SQLite and PostgreSQL
(docs/dedup.md, "Key rows are released").

``Store.release_submit_keys`` deletes a key's row once its Work ended and any window it was
created under passed; every other row stays, and a submit answers the same whether its key's
row was released or kept. On PostgreSQL, a submitter racing the sweep is made to stop at the two
moments that matter (``CONDUIT_TEST_FAULT`` in a submitter process): after its insert met the row,
before it locks it (the sweep deletes the row there: the submitter inserts again), and after it
pointed a stale row at its new Work, before it commits (the sweep's delete waits, then misses the
row: it no longer names the ended Work).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import anyio
import msgspec
import pytest

from conduit_core.model import Work, WorkStatus
from conduit_core.storage import DedupScope, SqlStore, Store, SubmitKey
from conduit_core.storage.conformance import T0
from tests.storage.test_submit_keys import _finish, _start, _submit

pytestmark = pytest.mark.anyio

WINDOW_MS = 600_000


async def _keys(store: Store) -> dict[str, str]:
    """Every key row: key -> the Work it names."""
    assert isinstance(store, SqlStore)
    rows = await anyio.to_thread.run_sync(lambda: store.transaction(
        lambda cx: cx.rows("SELECT submit_key, work_id FROM conduit_submit_key"), write=False
    ))  # fmt: skip
    return {str(key): str(work_id) for key, work_id in rows}


async def _sweep(store: Store, now_ms: int, scan: int = 1000) -> int:
    """Sweep the whole table; how many rows were released."""
    released, after = await store.release_submit_keys(after=None, scan=scan, now_ms=now_ms)
    while after is not None:
        more, after = await store.release_submit_keys(after=after, scan=scan, now_ms=now_ms)
        released += more
    return released


async def test_only_rows_that_name_nothing_are_released(store: Store) -> None:
    queued, active = SubmitKey(key="queued"), SubmitKey(key="active", scope=DedupScope.ACTIVE)
    await _submit(store, "w-queued", queued)  # not started: kept
    await _submit(store, "w-active", active)
    await _start(store, "w-active")  # running: kept
    await _submit(store, "w-started", SubmitKey(key="started"))
    await _start(store, "w-started")
    await _finish(store, "w-started", T0 + 10)  # ended: released
    await _submit(store, "w-cancelled", SubmitKey(key="cancelled", scope=DedupScope.ACTIVE))
    await store.cancel_work("w-cancelled", now_ms=T0 + 10)  # ended: released
    await _submit(store, "w-debounce", SubmitKey(key="debounce", quiet_ms=5_000))
    await store.cancel_work("w-debounce", now_ms=T0 + 10)  # ended: released
    window = SubmitKey(key="window", scope=DedupScope.WINDOW, window_ms=WINDOW_MS)
    await _submit(store, "w-window", window)
    await _start(store, "w-window")
    await _finish(store, "w-window", T0 + 10)  # ended, in its window: kept

    assert await _sweep(store, T0 + 20) == 3
    assert await _keys(store) == {
        "queued": "w-queued", "active": "w-active", "window": "w-window"
    }  # fmt: skip
    # Answers as before: the kept keys still name their Work, the released ones name none.
    assert await _submit(store, "w2", queued, T0 + 30) == ("w-queued", True)
    assert await _submit(store, "w3", active, T0 + 30) == ("w-active", True)
    assert await _submit(store, "w4", window, T0 + WINDOW_MS - 1) == ("w-window", True)
    assert await _submit(store, "w5", SubmitKey(key="started"), T0 + 30) == ("w5", False)

    assert await _sweep(store, T0 + WINDOW_MS) == 1  # the window passed
    assert "window" not in await _keys(store)
    assert await _submit(store, "w6", window, T0 + WINDOW_MS) == ("w6", False)


async def test_a_debounce_key_is_released_once_its_hold_is(store: Store) -> None:
    """A debounce key names its Work only while the start is held: after the timer released it
    (the Work is ready, not ended), the row goes; a key still held stays."""
    released, held = SubmitKey(key="fired", quiet_ms=5_000), SubmitKey(key="held", quiet_ms=60_000)
    await _submit(store, "w-fired", released, T0)
    await _submit(store, "w-held", held, T0)
    (timer,) = await store.due_timers(now_ms=T0 + 5_000, limit=10)

    def release(work: Work) -> Work:
        return msgspec.structs.replace(work, debounce=None)

    assert await store.fire_timer(timer.id, accept=None, update_work=release, now_ms=T0 + 5_000)
    assert (await store.get_work("w-fired")).status is WorkStatus.READY
    assert await _sweep(store, T0 + 5_001) == 1
    assert await _keys(store) == {"held": "w-held"}
    assert await _submit(store, "w2", released, T0 + 5_002) == ("w2", False)
    assert await _submit(store, "w3", held, T0 + 5_002) == ("w-held", True)


async def test_a_sweep_in_pieces_reaches_every_row_and_the_table_stays_small(
    store: Store,
) -> None:
    """Many distinct keys, each submitted, run and ended: the table holds only the keys of the
    Work not ended yet, however many keys were ever used."""
    for round_ in range(3):
        for n in range(25):
            work_id = f"w{round_}-{n}"
            await _submit(store, work_id, SubmitKey(key=f"order-{round_}-{n}"))
            await _start(store, work_id)
            if n % 5:  # four in five end; the others stay running
                await _finish(store, work_id, T0 + 10)
        released, after = await store.release_submit_keys(after=None, scan=7, now_ms=T0 + 20)
        assert after is not None  # 7 rows read, more left
        while after is not None:
            more, after = await store.release_submit_keys(after=after, scan=7, now_ms=T0 + 20)
            released += more
        assert released == 20
        assert len(await _keys(store)) == 5 * (round_ + 1)


async def test_a_window_is_the_one_its_work_was_created_under(store: Store) -> None:
    short = SubmitKey(key="k", scope=DedupScope.WINDOW, window_ms=WINDOW_MS)
    long = SubmitKey(key="k", scope=DedupScope.WINDOW, window_ms=2 * WINDOW_MS)
    assert await _submit(store, "w1", short) == ("w1", False)
    # Past w1's own window, within the later submit's longer one: a new Work, released row or not.
    assert await _submit(store, "w2", long, T0 + WINDOW_MS + 1) == ("w2", False)
    # A window submit meets a Work created without a window: joins it until it ends.
    a_window = SubmitKey(key="a", scope=DedupScope.WINDOW, window_ms=WINDOW_MS)
    assert await _submit(store, "a1", SubmitKey(key="a", scope=DedupScope.ACTIVE)) == ("a1", False)
    assert await _submit(store, "a2", a_window, T0 + 1) == ("a1", True)
    await store.cancel_work("a1", now_ms=T0 + 2)
    assert await _submit(store, "a3", a_window, T0 + 3) == ("a3", False)


# --- a submitter racing the sweep (PostgreSQL: concurrent writers) ----------------------------

_SUBMITTER = """
import sys, anyio, msgspec
from conduit_core.model import WorkKind
from conduit_core.storage import SubmitKey, open_store
from conduit_core.storage.conformance import T0, make_input, make_work

async def main():
    store = await open_store(sys.argv[1])
    work = msgspec.structs.replace(make_work(sys.argv[2], kind=WorkKind.TASK), created_at_ms=T0 + 5)
    got = await store.submit_keyed(work, SubmitKey(key="race"), first_input=make_input(sys.argv[2]),
                                   now_ms=T0 + 5)
    print(got.work.id, got.deduplicated)
    await store.aclose()

anyio.run(main)
"""


def _submitter(url: str, work_id: str, fault: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CONDUIT_TEST_FAULT": f"{fault}:sleep=1.5"}
    return subprocess.Popen([sys.executable, "-c", _SUBMITTER, url, work_id], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


async def _wait_idle_after(url: str, statement: str) -> None:
    """Until a session of the store's database sits in a transaction after ``statement`` (a
    prefix)."""
    import psycopg

    deadline = time.monotonic() + 20
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction' AND query LIKE %s",
                (statement + "%",),
            )
            row = await cur.fetchone()
            if row is not None and row[0]:
                return
            await anyio.sleep(0.02)
        cur = await conn.execute("SELECT state, query FROM pg_stat_activity "
                                 "WHERE datname = current_database()")  # fmt: skip
        seen = await cur.fetchall()
    raise AssertionError(f"no submitter stopped after {statement!r}: {seen}")


async def _wait_row_locked(url: str) -> None:
    """Until a session in a transaction holds a row lock of ``conduit_submit_key`` (its
    ``SELECT … FOR UPDATE`` ran: the row is the submitter's until it commits; its UPDATE may be
    sent with the commit, as the store batches writes)."""
    import psycopg

    deadline = time.monotonic() + 20
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = 'conduit_submit_key' AND l.mode = 'RowShareLock' "
                "AND l.granted AND l.pid <> pg_backend_pid() "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            row = await cur.fetchone()
            if row is not None and row[0]:
                return
            await anyio.sleep(0.02)
    raise AssertionError("no submitter locked the key's row")


def _answer(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out.strip()


async def _ended_holder(store: Store) -> None:
    await _submit(store, "old", SubmitKey(key="race"))
    await store.cancel_work("old", now_ms=T0 + 1)


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_row_released_under_a_submitter_is_inserted_again(
    store: Store, store_url: str
) -> None:
    await _ended_holder(store)
    proc = _submitter(store_url, "new", "store.submit_key_met")
    await _wait_idle_after(store_url, "INSERT INTO conduit_submit_key")
    assert await _sweep(store, T0 + 2) == 1  # the row named the cancelled Work
    assert _answer(proc) == "new False"
    assert await _keys(store) == {"race": "new"}
    assert {w.id for w in await store.list_work(limit=10)} == {"old", "new"}


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_row_a_submitter_took_over_is_never_released(store: Store, store_url: str) -> None:
    await _ended_holder(store)
    proc = _submitter(store_url, "new", "store.submit_key_taken_over")
    await _wait_row_locked(store_url)
    # The sweep reads the row naming the cancelled Work; its delete waits for the submitter's
    # commit, then finds the row names the new Work and leaves it.
    assert await _sweep(store, T0 + 2) == 0
    assert _answer(proc) == "new False"
    assert await _keys(store) == {"race": "new"}
    assert await _submit(store, "later", SubmitKey(key="race"), T0 + 6) == ("new", True)
