"""Set-based recovery claims (``Store.claim_recoveries``): chunking and statements per chunk.

The rules of each claim are conformance cases (``conformance_recovery``); these pin what the SQL
backends add: a claim of many attempts costs a few statements per chunk, not a few per attempt,
and chunk boundaries change nothing.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

import anyio.to_thread
import pytest

from conduit_core.errors import LeaseLostError
from conduit_core.storage import Claim, RecoveryRefusal, SqlStore, open_store
from conduit_core.storage import _ops_attempts as att
from conduit_core.storage._sql import SAVE_LEASED_EXECUTION, Cx, Row, SetWrite
from conduit_core.storage.conformance import LEASE_MS, T0, _claim, make_work

pytestmark = pytest.mark.anyio


class _Counting:
    """A Cx that counts the statements sent through it, and the writes deferred through it
    per kind (``Cx.defer``: on PostgreSQL a kind's held rows go as one statement)."""

    def __init__(self, cx: Cx) -> None:
        self._cx = cx
        self.locks_rows = cx.locks_rows
        self.statements = 0
        self.deferred: Counter[SetWrite] = Counter()

    def defer(self, write: SetWrite, params: tuple[Any, ...]) -> None:
        self.deferred[write] += 1
        self._cx.defer(write, params)

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        self.statements += 1
        return self._cx.rows(sql, params)

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.statements += 1
        self._cx.run(sql, params)

    def count(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        self.statements += 1
        return self._cx.count(sql, params)

    def many(self, sql: str, params: list[tuple[Any, ...]]) -> None:
        self.statements += 1
        self._cx.many(sql, params)

    def later(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        self.statements += 1
        return self._cx.later(sql, params)


async def _expired(store: SqlStore, count: int) -> list[str]:
    ids = []
    for n in range(count):
        await store.create_work(make_work(f"w{n:03}"))
        ids.append((await _claim(store, f"w{n:03}")).execution.id)
    return ids


async def test_a_chunk_of_attempts_costs_two_statements_and_one_held_write(
    store_url: str,
) -> None:
    async with await open_store(store_url) as store:
        assert isinstance(store, SqlStore)
        ids = await _expired(store, 60)
        counted: list[int] = []
        deferred: list[dict[SetWrite, int]] = []

        def claim(cx: Cx) -> list[Claim | RecoveryRefusal]:
            counting = _Counting(cx)
            out, _ = att.claim_recoveries(counting, ids, "heir", T0 + LEASE_MS, LEASE_MS)
            counted.append(counting.statements)
            deferred.append(dict(counting.deferred))
            return out

        call = partial(store.transaction, claim, write=True, shared=True)
        results = await anyio.to_thread.run_sync(call)
        assert all(isinstance(r, Claim) for r in results)
        # Lock the attempts with their leases, read the Work rows: two statements; and the
        # attempts' writes (each with its new lease) held, one statement on PostgreSQL (three
        # statements for sixty attempts; about seven each, one by one).
        assert counted[-1] == 2
        assert deferred[-1] == {SAVE_LEASED_EXECUTION: 60}
        assert [(await store.get_execution(i)).epoch for i in ids] == [2] * 60


async def test_chunk_boundaries_change_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(att, "_RECOVER_CHUNK", 3)
    async with await open_store(store_url) as store:
        assert isinstance(store, SqlStore)
        ids = await _expired(store, 8)
        # Two of them taken already, one unknown id: refusals in the middle of chunks.
        early = await store.claim_recoveries(
            [ids[2], ids[6]], owner="first", now_ms=T0 + LEASE_MS, lease_ms=LEASE_MS
        )
        assert all(isinstance(r, Claim) for r in early)
        wanted = [*ids[::-1], "unknown"]
        results = await store.claim_recoveries(
            wanted, owner="heir", now_ms=T0 + LEASE_MS, lease_ms=LEASE_MS
        )
        assert [r.execution.id if isinstance(r, Claim) else r.execution_id for r in results] == (
            wanted
        )
        codes = {r.execution_id: r.code for r in results if isinstance(r, RecoveryRefusal)}
        assert codes == {ids[2]: "not_eligible", ids[6]: "not_eligible", "unknown": "not_found"}
        for r in results:
            if isinstance(r, Claim):
                assert (r.lease.owner, r.execution.epoch) == ("heir", 2)
                assert r.work.id == r.execution.work_id
                assert await store.get_lease(r.execution.id) == r.lease


async def test_a_recovered_attempts_next_write_is_one_statement(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery claim leaves the claimed row's revision with the store, so the adoption's
    write (the executor's recovery metadata) takes the one-statement path, not the locked read;
    a claim that another handle superseded since falls back and is refused."""
    async with await open_store(store_url) as store, await open_store(store_url) as other:
        assert isinstance(store, SqlStore)
        ids = await _expired(store, 3)
        at = T0 + LEASE_MS
        claims = await store.claim_recoveries(ids, owner="heir", now_ms=at, lease_ms=LEASE_MS)
        assert all(isinstance(c, Claim) for c in claims)
        first, second, third = (c for c in claims if isinstance(c, Claim))
        # Negative control: released by another handle since (its revision moved on).
        await other.release_lease(second.lease, now_ms=at + 1)
        slow: list[str] = []
        locked_read = att.fenced_revision

        def counted(cx: Cx, lease: Any, now_ms: int, **kw: Any) -> Any:
            slow.append(lease.execution_id)
            return locked_read(cx, lease, now_ms, **kw)

        monkeypatch.setattr(att, "fenced_revision", counted)
        written = await store.persist_recovery(first.lease, {"pid": 1}, now_ms=at + 1)
        assert written.recovery == {"pid": 1}
        assert written.segments == first.execution.segments
        assert slow == []  # the fast path
        # The released one falls back to the locked read and is refused there.
        with pytest.raises(LeaseLostError):
            await store.persist_recovery(second.lease, {"pid": 2}, now_ms=at + 2)
        assert slow == [second.execution.id]
        assert (await store.get_execution(third.execution.id)).epoch == 2
