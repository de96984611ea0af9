"""PostgreSQL: the row versions one attempt leaves dead (issue 32, fewer dead rows per job).

An attempt's lease lives on its row (schema V14): the claim inserts the attempt with its lease,
and the settlement's write of the attempt drops it, so nothing is deleted on an attempt's path
(there was a lease row, inserted and deleted per attempt). A claim consumes its inputs by
raising its Work's ``input_floor`` (the last input it consumed) and writes no input row (schema
V15; before, each consumed input was rewritten with ``pending = 0``, a heap-only version per
job): every read of an input's ``pending`` starts above the floor. Counted from
``pg_stat_user_tables`` once the store's connections have closed (a backend reports its counts
at exit, at the latest). The index holds a Work's consumed inputs too, so a read of its pending
ones starts above the floor: a long-lived Work's history costs the read nothing.
"""

from __future__ import annotations

import time

import anyio
import msgspec
import psycopg
import pytest

from conduit_core.errors import LeaseLostError
from conduit_core.model import ExecutionStatus, WorkStatus
from conduit_core.storage import (
    AttemptEnd,
    Claim,
    ClaimRequest,
    Settlement,
    Store,
    open_store,
)
from conduit_core.storage._schema import TABLES
from conduit_core.storage.conformance import LEASE_MS, T0, make_input, make_work, snapshot
from tests.storage._undo import UNDO_V20

pytestmark = pytest.mark.anyio

JOBS = 4


def _table_counts(url: str) -> dict[str, tuple[int, int, int]]:
    """Per conduit table: updates, of them heap-only, deletes."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
            "WHERE relname LIKE 'conduit_%'"
        ).fetchall()
    return {name: (int(upd), int(hot), int(deleted)) for name, upd, hot, deleted in rows}


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_an_attempt_deletes_no_row_and_writes_no_input_row(
    store_url: str,
) -> None:
    async with await open_store(store_url) as store:
        for i in range(JOBS):
            await store.create_work(make_work(f"w{i}"), first_input=make_input(f"in{i}"))
        claims = await store.claim_ready(
            limit=JOBS, snapshot_for=lambda w: snapshot(), owner="o", now_ms=T0 + 1,
            lease_ms=30_000,
        )  # fmt: skip
        assert len(claims) == JOBS
        for claim in claims:
            assert isinstance(claim, Claim)
            # The two in-flight writes of a launch: its intent, then its recovery metadata.
            for key in ("launch_intent", "recovery"):
                await store.update_attempt(
                    claim.lease,
                    lambda ex, key=key: msgspec.structs.replace(ex, **{key: {"n": 1}}),
                    now_ms=T0 + 2,
                )
            await store.settle_attempt(
                claim.lease,
                lambda ex, w: Settlement(
                    end=AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True),
                    work=lambda w: w,
                ),
                now_ms=T0 + 3,
            )
            assert await store.get_lease(claim.execution.id) is None
    deadline = time.monotonic() + 30
    while True:  # the counts arrive once the store's backends have exited
        counts = _table_counts(store_url)
        if counts.get("conduit_execution", (0, 0, 0))[0] >= 3 * JOBS:
            break
        assert time.monotonic() < deadline, f"the counts never arrived: {counts}"
        await anyio.sleep(0.05)
    assert {name: c[2] for name, c in counts.items() if c[2]} == {}, "a row was deleted"
    # The attempt row three times (launch intent, recovery metadata, settlement, which also
    # drops the lease); the input once, heap-only.
    assert counts["conduit_execution"][0] == 3 * JOBS
    assert counts["conduit_event"][0] == 0, "a claim rewrote the input it consumed"
    assert "conduit_lease" not in counts
    assert "conduit_lease" not in TABLES


def _run(url: str, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
    """One statement behind the store's back, on either backend."""
    if url.startswith("sqlite://"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)
        try:
            return list(conn.execute(sql, params).fetchall())
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(sql.replace("?", "%s"), params)
        return list(cur.fetchall()) if cur.description else []


async def _claim_new_work(store: Store) -> Claim:
    """Work ``w``, submitted with input ``ev-0``, claimed by owner ``o`` at ``T0``."""
    await store.create_work(make_work("w"), first_input=make_input("0"))
    return await store.claim_attempt(
        ClaimRequest(work_id="w", snapshot=snapshot()), owner="o", now_ms=T0, lease_ms=LEASE_MS
    )


async def test_a_pending_read_starts_above_the_inputs_a_claim_consumed(store_url: str) -> None:
    async with await open_store(store_url) as store:
        claim = await _claim_new_work(store)
        assert [e.id for e in claim.inputs] == ["ev-0"]
        await store.settle_attempt(
            claim.lease,
            lambda ex, w: Settlement(
                end=AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True),
                work=lambda w: msgspec.structs.replace(w, status=WorkStatus.READY),
            ),
            now_ms=T0 + 1,
        )
        (consumed,) = claim.inputs
        assert _run(store_url, "SELECT input_floor FROM conduit_work WHERE id = ?", ("w",)) == [
            (consumed.seq,)
        ]
        # The consumed input marked pending again behind the store's back: below the floor, no
        # read sees it (without the floor, every read would deliver it a second time).
        _run(store_url, "UPDATE conduit_event SET pending = 1 WHERE id = ?", ("ev-0",))
        later = await store.accept_event(make_input("1", work_id="w"))
        assert later.seq > consumed.seq
        assert [e.id for e in await store.pending_inputs("w")] == ["ev-1"]
        assert [e.id for e in (await store.first_pending_inputs(["w"])).values()] == ["ev-1"]
        again = await store.claim_attempt(
            ClaimRequest(work_id="w", snapshot=snapshot()), owner="o", now_ms=T0 + 2,
            lease_ms=LEASE_MS,
        )  # fmt: skip
        assert [e.id for e in again.inputs] == ["ev-1"]
        assert _run(store_url, "SELECT input_floor FROM conduit_work WHERE id = ?", ("w",)) == [
            (later.seq,)
        ]


async def test_a_claim_consumes_its_inputs_by_the_floor_alone_and_every_read_agrees(
    store_url: str,
) -> None:
    """The claim leaves its input's row as it was (still flagged pending), yet every read says
    consumed: the event itself, the Work's event history, a redelivery, and a control's drop,
    which takes out only what is still pending (counting a consumed input would drop it twice
    from the Work's pending count)."""
    async with await open_store(store_url) as store:
        await store.create_work(make_work("w"), first_input=make_input("0"))
        await store.accept_event(make_input("1", work_id="w"))
        claim = await store.claim_attempt(
            ClaimRequest(work_id="w", snapshot=snapshot(), max_inputs=1), owner="o",
            now_ms=T0, lease_ms=LEASE_MS,
        )  # fmt: skip
        assert [e.id for e in claim.inputs] == ["ev-0"]
        stored = _run(store_url, "SELECT id, pending FROM conduit_event ORDER BY seq", ())
        assert stored == [("ev-0", 1), ("ev-1", 1)], "the claim wrote its input's row"
        assert (await store.get_event("ev-0")).pending is False
        assert (await store.get_event("ev-1")).pending is True
        assert [(e.id, e.pending) for e in await store.work_events("w")] == [
            ("ev-0", False), ("ev-1", True),
        ]  # fmt: skip
        assert (await store.accept_event(make_input("0", work_id="w"))).pending is False
        assert (await store.get_work("w")).pending_inputs == 1
        assert await store.drop_inputs("w", ["ev-0", "ev-1"]) == 1
        assert (await store.get_work("w")).pending_inputs == 0
        assert (await store.get_event("ev-1")).pending is False
        assert await store.pending_inputs("w") == []


#: Schema V14 undone (the store a V13 conduit left): the lease back in a table of its own.
UNDO_V14 = (
    *UNDO_V20,
    # V19's parked Work (the index of V17 and V18 names its column; they make it again).
    "DROP INDEX conduit_work_key_ready",
    "DROP INDEX conduit_work_key_parked",
    "DROP INDEX conduit_work_ready_order",
    "ALTER TABLE conduit_work DROP COLUMN key_parked",
    """CREATE TABLE conduit_lease (
        execution_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, epoch INTEGER NOT NULL,
        owner TEXT NOT NULL, token TEXT NOT NULL, expires_at_ms BIGINT NOT NULL,
        duration_ms BIGINT NOT NULL, released INTEGER NOT NULL)""",
    "CREATE INDEX conduit_lease_expiry ON conduit_lease (expires_at_ms)",
    "INSERT INTO conduit_lease SELECT id, work_id, epoch, lease_owner, lease_token, "
    "lease_expires_at_ms, lease_duration_ms, lease_released FROM conduit_execution "
    "WHERE lease_token IS NOT NULL",
    "DROP INDEX conduit_execution_lease_expiry",
    *(
        f"ALTER TABLE conduit_execution DROP COLUMN lease_{column}"
        for column in ("owner", "token", "expires_at_ms", "duration_ms", "released")
    ),
    "ALTER TABLE conduit_work DROP COLUMN input_floor",
    "DROP INDEX conduit_event_work",
    "CREATE INDEX conduit_event_pending ON conduit_event (work_id, seq) WHERE pending = 1",
    "UPDATE conduit_meta SET value = '13' WHERE key = 'schema_version'",
)


async def test_an_upgraded_store_keeps_the_leases_of_running_attempts(store_url: str) -> None:
    """A V13 store with a running attempt: after the upgrade its holder's lease still holds
    (its writes and renewals go through), and a stale token is still refused."""
    async with await open_store(store_url) as store:
        claim = await _claim_new_work(store)
    for statement in UNDO_V14:
        _run(store_url, statement, ())
    assert _run(store_url, "SELECT token FROM conduit_lease", ()) == [(claim.lease.token,)]
    async with await open_store(store_url) as store:  # migrates V13 -> current
        assert await store.get_lease(claim.execution.id) == claim.lease
        written = await store.update_attempt(
            claim.lease, lambda ex: msgspec.structs.replace(ex, recovery={"n": 1}), now_ms=T0 + 1
        )
        assert written.recovery == {"n": 1}
        (renewed,) = await store.renew_leases([claim.lease], now_ms=T0 + 2)
        assert renewed.expires_at_ms == T0 + 2 + LEASE_MS
        stale = msgspec.structs.replace(claim.lease, token="stale")
        with pytest.raises(LeaseLostError):
            await store.update_attempt(stale, lambda ex: ex, now_ms=T0 + 3)
