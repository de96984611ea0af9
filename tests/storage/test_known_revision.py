"""The one-statement fenced writes: a lease holder writes from the attempt row it last saw.

``SqlStore`` remembers, per attempt it holds, the row it last wrote (``Known``: lease token,
revision, document) and writes the next change in one statement guarded by that revision. These
cases pin the guard: a copy gone stale (another handle wrote the row, recovered it, or released
its lease) never overwrites the newer row; the write falls back to the locked read and either
applies the change to the current row or refuses with ``LeaseLostError``. The PostgreSQL case
races for real: a lease release commits while the fast write waits for the row lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest

from conduit_core.errors import LeaseLostError
from conduit_core.model import Execution, ExecutionStatus, WorkKind
from conduit_core.storage import AttemptEnd, ClaimRequest, Store, _sqlstore, open_store
from conduit_core.storage import _ops_attempts as att
from conduit_core.storage.conformance import LEASE_MS, T0, make_input, make_work, snapshot
from tests.storage.conftest import record_batch_sizes

pytestmark = pytest.mark.anyio


def _set(field: str, value: dict[str, Any]) -> Callable[[Execution], Execution]:
    return lambda ex: msgspec.structs.replace(ex, **{field: value})


def _one_statement_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of each batch of fenced writes sent as one (``update_attempts_later``)."""
    return record_batch_sizes(monkeypatch, _sqlstore.IN_TWO_STEPS, att.update_attempt, 1)


async def _claimed(store: Store, work_id: str = "w") -> Any:
    await store.create_work(
        make_work(work_id, kind=WorkKind.TASK), first_input=make_input(f"{work_id}-1")
    )
    return await store.claim_attempt(
        ClaimRequest(work_id=work_id, snapshot=snapshot()), owner="a", now_ms=T0,
        lease_ms=LEASE_MS,
    )  # fmt: skip


async def test_a_stale_copy_never_overwrites_a_newer_row(two: tuple[Store, Store]) -> None:
    a, b = two
    claim = await _claimed(a)
    await a.update_attempt(claim.lease, _set("launch_intent", {"by": "a"}), now_ms=T0 + 1)
    # Another handle writes the same attempt (same lease): a's remembered row is now stale.
    await b.update_attempt(claim.lease, _set("recovery", {"by": "b"}), now_ms=T0 + 2)
    written = await a.update_attempt(
        claim.lease, _set("launch_intent", {"by": "a", "again": True}), now_ms=T0 + 3
    )
    stored = await a.get_execution(claim.execution.id)
    assert stored.recovery == {"by": "b"}, "a's stale copy overwrote b's write"
    assert stored.launch_intent == {"by": "a", "again": True}
    assert written == stored
    # And the settlement from the stale copy keeps b's write too.
    await b.update_attempt(claim.lease, _set("recovery", {"by": "b", "n": 2}), now_ms=T0 + 4)
    end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True)
    settled = await a.finish_attempt(claim.lease, end, now_ms=T0 + 5, work=lambda w: w)
    assert settled.recovery == {"by": "b", "n": 2}
    assert (await a.get_execution(claim.execution.id)).status is ExecutionStatus.COMPLETED


async def test_a_recovered_attempt_refuses_its_old_holder(two: tuple[Store, Store]) -> None:
    a, b = two
    claim = await _claimed(a)
    await a.update_attempt(claim.lease, _set("launch_intent", {"by": "a"}), now_ms=T0 + 1)
    recovered = await b.claim_recovery(
        claim.execution.id, owner="b", now_ms=T0 + LEASE_MS + 1, lease_ms=LEASE_MS
    )
    assert recovered.execution.epoch == 2
    # a's clock lags: by its own now the old lease has not expired, the row has moved on.
    with pytest.raises(LeaseLostError):
        await a.update_attempt(claim.lease, _set("recovery", {"by": "a"}), now_ms=T0 + 2)
    end_a = AttemptEnd(status=ExecutionStatus.FAILED, exclusion_confirmed=True)
    with pytest.raises(LeaseLostError):
        await a.finish_attempt(claim.lease, end_a, now_ms=T0 + 3, work=lambda w: w)
    stored = await b.get_execution(claim.execution.id)
    assert stored.epoch == 2
    assert stored.recovery is None
    assert stored.status.live
    # The new holder's own writes go through, from the row it claimed.
    await b.update_attempt(recovered.lease, _set("recovery", {"by": "b"}), now_ms=T0 + 4)
    assert (await a.get_execution(claim.execution.id)).recovery == {"by": "b"}


async def test_a_released_lease_refuses_its_holder(two: tuple[Store, Store]) -> None:
    a, b = two
    claim = await _claimed(a)
    await a.update_attempt(claim.lease, _set("launch_intent", {"by": "a"}), now_ms=T0 + 1)
    await b.release_lease(claim.lease, now_ms=T0 + 2)
    with pytest.raises(LeaseLostError):
        await a.update_attempt(claim.lease, _set("recovery", {"by": "a"}), now_ms=T0 + 3)
    assert (await a.get_execution(claim.execution.id)).recovery is None


# --- PostgreSQL: the release commits while the fast write waits for the attempt row ---------


def _release_in_open_transaction(url: str, lease: Any, *, touch: bool) -> Iterator[None]:
    """Release ``lease`` in a transaction of its own connection and hold it open (yield)."""
    import psycopg

    from conduit_core.storage._postgres import _PgCx

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        cx = _PgCx(cur)
        if touch:
            att.release_lease(cx, lease, T0 + 2)
        else:  # the release without its revision bump: the negative control
            att.fenced(cx, lease, T0 + 2, check_expiry=False)
            cx.run(
                "UPDATE conduit_execution SET lease_released = 1 WHERE id = ?",
                (lease.execution_id,),
            )
        yield
        cur.execute("COMMIT")


def _without_the_lease_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-statement writes guarded by the attempt's revision alone: the lease is on the
    attempt's row (schema V14), so PostgreSQL's recheck of a row updated meanwhile also sees a
    release; without that check, only the revision bump refuses a write past a release."""
    for name, lease_check in (
        ("_KNOWN_UPDATE_SQL", " AND lease_token = ? AND lease_released = 0 "
                              "AND lease_expires_at_ms > ?"),
        ("_KNOWN_UPDATES_SQL", "AND conduit_execution.lease_token = v.token "
                               "AND conduit_execution.lease_released = 0 "
                               "AND conduit_execution.lease_expires_at_ms > v.now_ms "),
    ):  # fmt: skip
        sql = getattr(att, name)
        assert lease_check in sql, name
        if name == "_KNOWN_UPDATE_SQL":  # its two parameters still bound, checked as true
            unchecked = sql.replace(lease_check, " AND ?::text IS NOT NULL AND ?::bigint > 0")
        else:
            unchecked = sql.replace(lease_check, "AND v.token IS NOT NULL AND v.now_ms > 0 ")
        monkeypatch.setattr(att, name, unchecked)


def _waiting_for_a_lock(url: str) -> bool:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


async def _race(url: str, *, touch: bool, beside: bool = False) -> BaseException | Execution:
    """The fast write of an attempt whose lease a concurrent transaction released. ``beside``:
    another attempt's write goes in the same batch (one statement for both, see
    ``update_attempts_later``), which the caller counts."""
    store = await open_store(url)
    try:
        claim = await _claimed(store)
        other = await _claimed(store, "w-beside")
        for held in (claim, other):
            await store.update_attempt(held.lease, _set("launch_intent", {"n": 1}), now_ms=T0 + 1)
        release = _release_in_open_transaction(url, claim.lease, touch=touch)
        await anyio.to_thread.run_sync(next, release)  # released, not yet committed
        outcome: list[BaseException | Execution] = []

        async def write() -> None:
            try:
                outcome.append(
                    await store.update_attempt(
                        claim.lease, _set("recovery", {"late": True}), now_ms=T0 + 3
                    )
                )
            except LeaseLostError as exc:
                outcome.append(exc)

        async def write_beside() -> None:
            written = await store.update_attempt(
                other.lease, _set("recovery", {"beside": True}), now_ms=T0 + 3
            )
            assert written.recovery == {"beside": True}

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            if beside:
                tg.start_soon(write_beside)
            deadline = time.monotonic() + 20
            while not await anyio.to_thread.run_sync(_waiting_for_a_lock, url):
                assert time.monotonic() < deadline, "the fast write never waited for the row"
                assert not outcome, f"the write did not wait for the release: {outcome}"
                await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(next, release, None)  # commit the release
        if beside:
            assert (await store.get_execution(other.execution.id)).recovery == {"beside": True}
        return outcome[0]
    finally:
        await store.aclose()


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_postgres_a_release_racing_a_fast_write_refuses_it(store_url: str) -> None:
    outcome = await _race(store_url, touch=True)
    assert isinstance(outcome, LeaseLostError), f"written after its lease was released: {outcome}"


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("touch", [True, False], ids=["release", "negative-control"])
async def test_postgres_a_release_racing_a_batched_write_refuses_it(
    store_url: str, touch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race with the write in one statement beside another attempt's write; the
    negative control (a release without its revision bump) lets the write through."""
    monkeypatch.setattr(_sqlstore, "ONE_STATEMENT_FROM", 2)
    batches = _one_statement_batches(monkeypatch)
    if not touch:
        _without_the_lease_check(monkeypatch)
    outcome = await _race(store_url, touch=touch, beside=True)
    assert batches == [2], f"the two writes did not go in one statement: {batches}"
    if touch:
        assert isinstance(outcome, LeaseLostError), f"written after its release: {outcome}"
    else:
        assert isinstance(outcome, Execution), f"the control did not reproduce the race: {outcome}"


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_postgres_negative_control_without_the_revision_bump(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The detector sees the anomaly it guards against: a release that does not bump the
    attempt's revision lets the waiting one-statement write through after the release, once
    the write no longer checks the lease on the row (both guards off; either one suffices)."""
    _without_the_lease_check(monkeypatch)
    outcome = await _race(store_url, touch=False)
    assert isinstance(outcome, Execution), f"the control did not reproduce the race: {outcome}"


async def test_a_batch_of_fenced_writes_goes_in_two_steps(
    two: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fenced writes batched together send every statement, then take every count (one round
    trip on PostgreSQL): a current copy is written by its statement, a stale one falls back to
    the locked read and keeps the newer row, a released lease refuses, each on its own."""
    a, b = two
    current, stale, released = [await _claimed(a, f"w{i}") for i in range(3)]
    for claim in (current, stale, released):
        await a.update_attempt(claim.lease, _set("launch_intent", {"by": "a"}), now_ms=T0 + 1)
    await b.update_attempt(stale.lease, _set("recovery", {"by": "b"}), now_ms=T0 + 2)
    await b.release_lease(released.lease, now_ms=T0 + 2)
    batches: list[int] = []
    in_two_steps = _sqlstore._batch_in_two_steps

    def counted(ordered: list[Any], cx: Any) -> None:
        batches.append(len(ordered))
        in_two_steps(ordered, cx)

    monkeypatch.setattr(_sqlstore, "_batch_in_two_steps", counted)
    outcomes: dict[str, Any] = {}

    async def write(claim: Any) -> None:
        try:
            outcomes[claim.work.id] = await a.update_attempt(
                claim.lease, _set("launch_intent", {"by": "a", "n": 2}), now_ms=T0 + 3
            )
        except LeaseLostError as exc:
            outcomes[claim.work.id] = exc

    async with anyio.create_task_group() as tg:
        for claim in (current, stale, released):
            tg.start_soon(write, claim)

    assert batches == [3]  # one batch, sent in two steps
    assert outcomes["w0"].launch_intent == {"by": "a", "n": 2}
    assert outcomes["w1"].launch_intent == {"by": "a", "n": 2}
    assert outcomes["w1"].recovery == {"by": "b"}, "the stale copy overwrote the newer row"
    assert isinstance(outcomes["w2"], LeaseLostError)
    for work_id, claim in (("w0", current), ("w1", stale)):
        assert await a.get_execution(claim.execution.id) == outcomes[work_id]
    assert (await a.get_execution(released.execution.id)).launch_intent == {"by": "a"}


async def test_a_batch_of_fenced_writes_is_one_statement_each_outcome_its_own(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fenced writes batched together go as one statement (``update_attempts_later``), yet each
    has its own outcome, as if each ran alone in the batch's order: two writes of one attempt
    both apply, the second over the first; a change that refuses raises for itself only."""
    monkeypatch.setattr(_sqlstore, "ONE_STATEMENT_FROM", 2)  # this batch of 4 goes as one
    sizes = _one_statement_batches(monkeypatch)
    store = await open_store(store_url)
    try:
        first, second = await _claimed(store, "w1"), await _claimed(store, "w2")
        for claim in (first, second):
            await store.update_attempt(claim.lease, _set("launch_intent", {"n": 1}), now_ms=T0 + 1)
        sizes.clear()
        outcomes: dict[str, Any] = {}

        def ended(ex: Execution) -> Execution:
            return msgspec.structs.replace(ex, status=ExecutionStatus.COMPLETED)

        async def write(name: str, claim: Any, change: Callable[[Execution], Execution]) -> None:
            try:
                outcomes[name] = await store.update_attempt(claim.lease, change, now_ms=T0 + 2)
            except ValueError as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, "a", first, _set("recovery", {"a": 1}))
            tg.start_soon(write, "b", first, _set("launch_intent", {"b": 2}))
            tg.start_soon(write, "refused", second, ended)
            tg.start_soon(write, "d", second, _set("recovery", {"d": 4}))
        assert sizes == [4], f"not one batch in one statement: {sizes}"
        assert isinstance(outcomes["refused"], ValueError)
        assert outcomes["a"].recovery == {"a": 1}
        assert outcomes["b"].recovery == {"a": 1}, "the second write lost the first"
        assert outcomes["b"].launch_intent == {"b": 2}
        assert outcomes["d"].recovery == {"d": 4}
        assert outcomes["d"].status is ExecutionStatus.LAUNCHING
        assert await store.get_execution(first.execution.id) == outcomes["b"]
        assert await store.get_execution(second.execution.id) == outcomes["d"]
        # Each attempt's next write still takes the fast path from what was written.
        again = await store.update_attempt(
            first.lease, _set("recovery", {"again": True}), now_ms=T0 + 3
        )
        assert again.launch_intent == {"b": 2}
    finally:
        await store.aclose()


async def test_a_batch_of_eight_fenced_writes_is_one_statement_by_default(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the default threshold a batch of ``ONE_STATEMENT_FROM`` launch writes (as the attempts
    of a busy host send them) goes as one statement, and each is written."""
    store = await open_store(store_url)
    count = _sqlstore.ONE_STATEMENT_FROM
    claims = [await _claimed(store, f"w{i}") for i in range(count)]
    for claim in claims:
        await store.update_attempt(claim.lease, _set("launch_intent", {"n": 1}), now_ms=T0 + 1)
    sizes = _one_statement_batches(monkeypatch)
    try:
        async with anyio.create_task_group() as tg:
            for i, claim in enumerate(claims):
                tg.start_soon(
                    partial(store.update_attempt, now_ms=T0 + 2),
                    claim.lease,
                    _set("recovery", {"i": i}),
                )
        assert sizes == [count], f"not one statement: {sizes}"
        for i, claim in enumerate(claims):
            written = await store.get_execution(claim.execution.id)
            assert written.recovery == {"i": i}
            assert written.launch_intent == {"n": 1}
    finally:
        await store.aclose()
