"""The storage conformance suite: every backend passes these cases.

A third-party backend runs it by importing the cases into a test module and providing a
``store_factory`` fixture that returns a :class:`StoreFactory` for a fresh, empty store::

    from conduit_core.storage.conformance import *  # noqa: F403

    @pytest.fixture
    def store_factory(tmp_path):
        return StoreFactory(open=lambda: open_store(...), url=...)

The held-recovery cases live in :mod:`conduit_core.storage.conformance_recovery`, the Routine
ledger's set-based writes in :mod:`conduit_core.storage.conformance_routines`; import their
cases the same way.

``StoreFactory.open`` opens a new, independent handle on the same store each time it is called.
``url`` (optional) lets the cases that use several processes open the store with ``open_store``.
Async cases use anyio's pytest plugin.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import msgspec
import pytest

from conduit_core.errors import CapacityError, LeaseLostError
from conduit_core.model import (
    AttemptSnapshot,
    BudgetLedger,
    ControlIntent,
    ControlKind,
    ControlStatus,
    Event,
    ExecutionStatus,
    Hold,
    HoldKind,
    Routine,
    Timer,
    TimerKind,
    Wait,
    Work,
    WorkKind,
    WorkStatus,
    WorkTemplate,
)
from conduit_core.storage._contract import (
    AttemptEnd,
    CapacityLimits,
    Claim,
    ClaimRequest,
    NotEligibleError,
    StaleDispatchError,
    Store,
)
from conduit_core.storage._race import check_no_overlap, max_overlap, run_race

__all__ = [
    "StoreFactory",
    "make_input",
    "make_work",
    "pytestmark",
    "snapshot",
    "store",
    "test_capacity_limits_count_pools_scopes_and_unconfirmed_exclusion",
    "test_capacity_never_exceeded_across_processes",
    "test_capacity_never_exceeded_by_two_racing_claimers",
    "test_confirm_stopped_refused_after_adoption_at_another_epoch",
    "test_config_generation_is_monotonic_and_idempotent",
    "test_control_settles_only_with_live_dispatch_token",
    "test_duplicate_delivery_id_is_a_noop",
    "test_expired_lease_write_refused",
    "test_first_pending_inputs_reads_each_works_oldest",
    "test_held_or_backing_off_work_is_not_claimed",
    "test_lease_renew_survives_clock_step_back",
    "test_monotonic_attempt_numbers",
    "test_next_timer_due_is_the_earliest_armed",
    "test_one_live_attempt_per_work",
    "test_one_live_attempt_per_work_across_processes",
    "test_park_and_resume_bumps_epoch",
    "test_recovery_claim_bumps_epoch_and_fences_old_holder",
    "test_released_lease_write_refused",
    "test_renew_after_expiry_refused",
    "test_reopen_sees_every_committed_record",
    "test_stale_epoch_write_refused",
    "test_timers_fire_exactly_once_under_two_drivers",
]

pytestmark = pytest.mark.anyio

LEASE_MS = 10_000
T0 = 1_000_000


@dataclass(frozen=True)
class StoreFactory:
    """Opens independent handles on one fresh store."""

    open: Callable[[], Awaitable[Store]]
    #: A URL ``open_store`` accepts in another process, or ``None`` to skip multi-process cases.
    url: str | None = None


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[Store]:
    handle = await store_factory.open()
    try:
        yield handle
    finally:
        await handle.aclose()


def snapshot(pool: str | None = None) -> AttemptSnapshot:
    return AttemptSnapshot(
        config_generation=1,
        binding="b",
        executor="inproc",
        executor_generation=1,
        pool=pool,
        timeout_seconds=3600,
        deadline_ms=T0 + 3_600_000,
    )


def make_work(work_id: str, *, scope: str = "root", kind: WorkKind = WorkKind.STANDING) -> Work:
    return Work(id=work_id, scope=scope, binding="b", kind=kind, created_at_ms=T0, updated_at_ms=T0)


def make_input(n: str, work_id: str | None = None) -> Event:
    """A pending input ``ev-<n>`` (a Work's first input when ``work_id`` is None): Work of every
    kind, standing included, is claimable only with pending input."""
    return _event(n, work_id)


def _event(n: str, work_id: str | None = None) -> Event:
    return Event(
        id=f"ev-{n}", delivery_id=f"d-{n}", type="t", work_id=work_id, pending=True,
        accepted_at_ms=T0,
    )  # fmt: skip


def _ready(w: Work) -> Work:
    return msgspec.structs.replace(w, status=WorkStatus.READY)


async def _feed(store: Store, work_id: str) -> None:
    """Give ``work_id`` one pending input unless it has one: a standing Work idles without input
    (it is claimable only with pending input, like every kind)."""
    if not await store.pending_inputs(work_id):
        _FED[work_id] = _FED.get(work_id, 0) + 1
        await store.accept_event(_event(f"feed-{work_id}-{_FED[work_id]}", work_id))


_FED: dict[str, int] = {}


async def _claim(store: Store, work_id: str, now: int = T0, pool: str | None = None) -> Claim:
    await _feed(store, work_id)
    return await store.claim_attempt(
        ClaimRequest(work_id=work_id, snapshot=snapshot(pool)),
        owner="test",
        now_ms=now,
        lease_ms=LEASE_MS,
    )


async def _complete(store: Store, claim: Claim, now: int, *, confirmed: bool = True) -> None:
    end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=confirmed)
    await store.finish_attempt(claim.lease, end, now_ms=now, work=_ready)


# --- Attempts and leases --------------------------------------------------------------------


async def test_monotonic_attempt_numbers(store: Store) -> None:
    await store.create_work(make_work("w"))
    numbers = []
    for i in range(3):
        claim = await _claim(store, "w", T0 + i * 100)
        numbers.append(claim.execution.attempt)
        with pytest.raises(NotEligibleError):  # a refused claim takes no number
            await _claim(store, "w", T0 + i * 100 + 1)
        await _complete(store, claim, T0 + i * 100 + 2)
    assert numbers == [1, 2, 3]
    assert (await store.get_work("w")).last_attempt == 3
    assert [e.attempt for e in await store.list_executions("w")] == [1, 2, 3]


async def test_one_live_attempt_per_work(store: Store) -> None:
    await store.create_work(make_work("w", kind=WorkKind.TASK), first_input=_event("1"))
    claim = await _claim(store, "w")
    assert claim.execution.epoch == 1
    assert claim.execution.status is ExecutionStatus.LAUNCHING
    assert [e.id for e in claim.inputs] == ["ev-1"]
    assert claim.execution.inputs == ["ev-1"]
    await store.accept_event(_event("2", "w"))  # new input does not make it claimable again
    with pytest.raises(NotEligibleError):
        await _claim(store, "w")
    assert [e.id for e in await store.live_executions()] == [claim.execution.id]


async def test_stale_epoch_write_refused(store: Store) -> None:
    await store.create_work(make_work("w"))
    old = await _claim(store, "w")
    await store.release_lease(old.lease, now_ms=T0 + 1)
    new = await store.claim_recovery(old.execution.id, owner="b", now_ms=T0 + 2, lease_ms=LEASE_MS)
    assert new.lease.epoch == 2
    with pytest.raises(LeaseLostError):
        await store.persist_recovery(old.lease, {"pid": 1}, now_ms=T0 + 3)
    ex = await store.persist_recovery(new.lease, {"pid": 2}, now_ms=T0 + 3)
    assert ex.recovery == {"pid": 2}


async def test_expired_lease_write_refused(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    # Negative control: one millisecond before expiry the write goes through.
    await store.mark_invoked(claim.lease, isolated=False, now_ms=T0 + LEASE_MS - 1)
    with pytest.raises(LeaseLostError):
        await store.persist_recovery(claim.lease, {"x": 1}, now_ms=T0 + LEASE_MS)
    with pytest.raises(LeaseLostError):
        await _complete(store, claim, T0 + LEASE_MS + 1)


async def test_released_lease_write_refused(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    await store.release_lease(claim.lease, now_ms=T0 + 1)
    with pytest.raises(LeaseLostError):
        await store.mark_invoked(claim.lease, isolated=False, now_ms=T0 + 2)
    with pytest.raises(LeaseLostError):
        await store.renew_lease(claim.lease, now_ms=T0 + 2)
    expired = await store.expired_attempts(now_ms=T0 + 2)
    assert [e.id for e in expired] == [claim.execution.id]  # recoverable at once


async def test_renew_after_expiry_refused(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    renewed = await store.renew_lease(claim.lease, now_ms=T0 + 5_000)
    assert renewed.expires_at_ms == T0 + 5_000 + LEASE_MS
    with pytest.raises(LeaseLostError):
        await store.renew_lease(renewed, now_ms=renewed.expires_at_ms)


async def test_lease_renew_survives_clock_step_back(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w", now=T0)
    later = await store.renew_lease(claim.lease, now_ms=T0 + 5_000)
    assert later.expires_at_ms == T0 + 5_000 + LEASE_MS
    stepped_back = await store.renew_lease(claim.lease, now_ms=T0 - 60_000)
    assert stepped_back.expires_at_ms == later.expires_at_ms  # never shortened
    stored = await store.get_lease(claim.execution.id)
    assert stored is not None
    assert stored.expires_at_ms == later.expires_at_ms


async def test_recovery_claim_bumps_epoch_and_fences_old_holder(store: Store) -> None:
    await store.create_work(make_work("w"))
    old = await _claim(store, "w")
    with pytest.raises(NotEligibleError):  # the lease is still live
        await store.claim_recovery(old.execution.id, owner="b", now_ms=T0 + 1, lease_ms=LEASE_MS)
    at = T0 + LEASE_MS
    assert [e.id for e in await store.expired_attempts(now_ms=at)] == [old.execution.id]
    new = await store.claim_recovery(old.execution.id, owner="b", now_ms=at, lease_ms=LEASE_MS)
    ex = new.execution
    assert (ex.epoch, ex.status, new.lease.epoch) == (2, ExecutionStatus.RECOVERING, 2)
    first, second = ex.segments
    assert first.ended_at_ms == at
    assert second.started_at_ms == at
    assert second.recovered
    assert second.epoch == 2
    assert second.ended_at_ms is None
    for write in (
        store.renew_lease(old.lease, now_ms=at + 1),
        store.mark_invoked(old.lease, isolated=False, now_ms=at + 1),
        _complete(store, old, at + 1),
    ):
        with pytest.raises(LeaseLostError):
            await write
    assert await store.adoptable(old.lease)  # recovery owns it now, at a newer epoch
    await _complete(store, new, at + 2)
    assert not await store.adoptable(new.lease)
    assert (await store.get_execution(ex.id)).status is ExecutionStatus.COMPLETED


async def test_park_and_resume_bumps_epoch(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    wait = Wait(execution_id=claim.execution.id, work_id="w", event_type="go", created_at_ms=T0)
    park = AttemptEnd(status=ExecutionStatus.PARKED, remaining_budget_ms=500)
    await store.finish_attempt(
        claim.lease,
        park,
        now_ms=T0 + 10,
        work=lambda w: msgspec.structs.replace(w, status=WorkStatus.WAITING),
        wait=wait,
    )
    assert await store.matching_waits(event_type="go", correlation_key=None) == [wait]
    assert await store.live_executions() == []
    resumed = await store.resume_attempt(
        claim.execution.id, owner="o", now_ms=T0 + 20, lease_ms=LEASE_MS, wake_event_id="e"
    )
    assert resumed.lease.epoch == 2
    assert resumed.execution.status is ExecutionStatus.RESUMING
    assert resumed.execution.segments[-1].wake_event_id == "e"
    assert await store.matching_waits(event_type="go", correlation_key=None) == []
    with pytest.raises(LeaseLostError):
        await store.mark_invoked(claim.lease, isolated=False, now_ms=T0 + 21)


async def test_confirm_stopped_refused_after_adoption_at_another_epoch(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    await store.release_lease(claim.lease, now_ms=T0 + 1)
    await store.claim_recovery(claim.execution.id, owner="b", now_ms=T0 + 2, lease_ms=LEASE_MS)
    with pytest.raises(LeaseLostError):
        await store.confirm_stopped(claim.execution.id, 1, now_ms=T0 + 3)
    ex = await store.confirm_stopped(claim.execution.id, 2, now_ms=T0 + 3)
    assert ex.exclusion_confirmed


# --- Work, input, holds ---------------------------------------------------------------------


async def test_duplicate_delivery_id_is_a_noop(store: Store) -> None:
    await store.create_work(make_work("w", kind=WorkKind.TASK))
    first = await store.accept_event(_event("1", "w"))
    again = await store.accept_event(msgspec.structs.replace(_event("1", "w"), id="other"))
    assert again == first
    assert [e.id for e in await store.pending_inputs("w")] == ["ev-1"]
    assert (await store.get_work("w")).pending_inputs == 1
    second = await store.accept_event(_event("2", "w"))
    assert second.seq > first.seq


async def test_first_pending_inputs_reads_each_works_oldest(store: Store) -> None:
    for wid in ("a", "b", "c"):
        await store.create_work(make_work(wid, kind=WorkKind.TASK))
    for n, wid in (("1", "a"), ("2", "b"), ("3", "a")):
        await store.accept_event(_event(n, wid))
    first = await store.first_pending_inputs(["a", "b", "c", "unknown"])
    assert {wid: e.id for wid, e in first.items()} == {"a": "ev-1", "b": "ev-2"}
    assert await store.first_pending_inputs([]) == {}


async def test_next_timer_due_is_the_earliest_armed(store: Store) -> None:
    assert await store.next_timer_due() is None
    await store.arm_timer(Timer(id="late", kind=TimerKind.RETRY, due_at_ms=T0 + 50))
    await store.arm_timer(Timer(id="soon", kind=TimerKind.RETRY, due_at_ms=T0 + 5))
    assert await store.next_timer_due() == T0 + 5
    assert await store.fire_timer("soon", now_ms=T0 + 5) is not None
    assert await store.next_timer_due() == T0 + 50


async def test_held_or_backing_off_work_is_not_claimed(store: Store) -> None:
    await store.create_work(make_work("w"))
    hold = Hold(work_id="w", kind=HoldKind.GATE, holder="human", reason="ask", created_at_ms=T0)
    await store.put_hold(hold)
    assert (await store.get_work("w")).status is WorkStatus.HELD
    assert await store.ready_work(limit=10) == []
    with pytest.raises(NotEligibleError):
        await _claim(store, "w")
    assert await store.delete_hold("w", HoldKind.GATE, "human")
    assert [w.id for w in await store.ready_work(limit=10)] == ["w"]
    timer = Timer(id="t", kind=TimerKind.RETRY, due_at_ms=T0 + 5, work_id="w")
    await store.arm_timer(timer)
    await store.update_work(
        "w", lambda w: msgspec.structs.replace(w, retry_timer_id="t"), now_ms=T0
    )
    with pytest.raises(NotEligibleError):
        await _claim(store, "w")
    fired = await store.fire_timer(
        "t",
        accept=_event("retry"),
        update_work=lambda w: msgspec.structs.replace(w, retry_timer_id=None),
        now_ms=T0 + 5,
    )
    assert fired == timer
    assert (await _claim(store, "w", T0 + 6)).execution.attempt == 1


# --- Timers, controls, generations ----------------------------------------------------------


async def test_timers_fire_exactly_once_under_two_drivers(store_factory: StoreFactory) -> None:
    a, b = await store_factory.open(), await store_factory.open()
    ids = [f"t{i:03}" for i in range(60)]
    for i, timer_id in enumerate(ids):
        await a.arm_timer(Timer(id=timer_id, kind=TimerKind.DEADLINE, due_at_ms=T0 + i))
    await a.arm_timer(Timer(id="later", kind=TimerKind.DEADLINE, due_at_ms=T0 + 10**6))
    fired: dict[str, list[str]] = {"a": [], "b": []}

    async def drive(name: str, handle: Store) -> None:
        while due := await handle.due_timers(now_ms=T0 + 1_000, limit=7):
            for timer in due:
                if await handle.fire_timer(timer.id) is not None:
                    fired[name].append(timer.id)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive, "a", a)
            tg.start_soon(drive, "b", b)
        assert sorted(fired["a"] + fired["b"]) == ids
        assert not set(fired["a"]) & set(fired["b"])
        assert [t.id for t in await a.due_timers(now_ms=T0 + 10**7)] == ["later"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_control_settles_only_with_live_dispatch_token(store: Store) -> None:
    intent = ControlIntent(
        id="c", work_id="w", execution_id="w#1", epoch=1, kind=ControlKind.INJECT,
        created_at_ms=T0,
    )  # fmt: skip
    assert await store.create_control(intent) == intent
    first = await store.claim_control("c", now_ms=T0)
    second = await store.claim_control("c", now_ms=T0 + 1)  # a retry takes a fresh token
    assert first.dispatch_token
    assert second.dispatch_token != first.dispatch_token
    with pytest.raises(StaleDispatchError):
        await store.settle_control("c", first.dispatch_token, ControlStatus.ACKNOWLEDGED, now_ms=2)
    assert second.dispatch_token is not None
    settled = await store.settle_control(
        "c", second.dispatch_token, ControlStatus.ACKNOWLEDGED, now_ms=T0 + 2
    )
    assert settled.status is ControlStatus.ACKNOWLEDGED
    assert await store.open_controls() == []


async def test_config_generation_is_monotonic_and_idempotent(store: Store) -> None:
    one = await store.record_config_generation("sha-a", now_ms=T0)
    two = await store.record_config_generation("sha-b", now_ms=T0 + 1)
    again = await store.record_config_generation("sha-a", now_ms=T0 + 2)
    assert (one.generation, two.generation, again) == (1, 2, one)
    assert await store.latest_config_generation() == two


# --- Capacity -------------------------------------------------------------------------------


async def test_capacity_limits_count_pools_scopes_and_unconfirmed_exclusion(store: Store) -> None:
    for i in range(4):
        await store.create_work(make_work(f"j{i}", scope="team/a"), first_input=_event(f"j{i}"))
        await store.create_work(make_work(f"g{i}", scope="team/b"), first_input=_event(f"g{i}"))
    limits = CapacityLimits(
        global_limit=2,
        pool_limits={"jobs": 1},
        scope_limits={"team": 3},
        scope_parents={"team/a": "team", "team/b": "team"},
    )

    async def claim(work_id: str, pool: str | None) -> Claim:
        request = ClaimRequest(work_id=work_id, snapshot=snapshot(pool))
        return await store.claim_attempt(
            request, owner="o", now_ms=T0, lease_ms=LEASE_MS, capacity=limits
        )

    job = await claim("j0", "jobs")
    with pytest.raises(CapacityError) as refused:
        await claim("j1", "jobs")
    assert refused.value.code == "capacity_job_concurrency"
    await claim("g0", None)  # the agent pool is separate from the jobs pool
    await claim("g1", None)
    with pytest.raises(CapacityError) as refused:
        await claim("g2", None)
    assert refused.value.code == "capacity_concurrency"
    # A finished attempt keeps its slot until its resource exclusion is confirmed.
    await _complete(store, job, T0 + 1, confirmed=False)
    assert [e.id for e in await store.unconfirmed_exclusions()] == [job.execution.id]
    with pytest.raises(CapacityError):
        await claim("j1", "jobs")
    await store.confirm_stopped(job.execution.id, 1, now_ms=T0 + 2)
    await claim("j1", "jobs")  # 3 in scope "team" now (j1, g0, g1)
    wider = msgspec.structs.replace(limits, pool_limits={"jobs": 5}, global_limit=5)
    with pytest.raises(CapacityError) as refused:
        await store.claim_attempt(
            ClaimRequest(work_id="j2", snapshot=snapshot("jobs")),
            owner="o", now_ms=T0, lease_ms=LEASE_MS, capacity=wider,
        )  # fmt: skip
    assert refused.value.code == "capacity_scope"


async def test_capacity_never_exceeded_by_two_racing_claimers(store_factory: StoreFactory) -> None:
    a, b = await store_factory.open(), await store_factory.open()
    for i in range(12):
        await a.create_work(make_work(f"w{i:02}"), first_input=_event(f"w{i:02}"))
    limits = CapacityLimits(global_limit=3)
    claimed: list[Claim] = []

    async def claimer(handle: Store) -> None:
        for _ in range(6):
            outcomes = await handle.claim_ready(
                limit=4,
                snapshot_for=lambda w: snapshot(),
                owner="o",
                now_ms=T0,
                lease_ms=LEASE_MS,
                capacity=limits,
            )
            claimed.extend(o for o in outcomes if isinstance(o, Claim))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(claimer, a)
            tg.start_soon(claimer, b)
        assert len(claimed) == 3
        assert len(await a.live_executions()) == 3
    finally:
        await a.aclose()
        await b.aclose()


# --- Durability -----------------------------------------------------------------------------


async def test_reopen_sees_every_committed_record(store_factory: StoreFactory) -> None:
    a = await store_factory.open()
    try:
        await a.create_work(make_work("w", kind=WorkKind.TASK), first_input=_event("1"))
        claim = await _claim(a, "w")
        await a.accept_event(_event("2", "w"))
        await a.create_work(make_work("other"))
        timer = Timer(id="t", kind=TimerKind.RETRY, due_at_ms=T0, work_id="other")
        await a.arm_timer(timer)
        hold = Hold(work_id="other", kind=HoldKind.BUDGET, holder="k", reason="r", created_at_ms=1)
        await a.put_hold(hold)
        wait = Wait(execution_id="x", work_id="other", event_type="e", created_at_ms=T0)
        await a.register_wait(wait)
        intent = ControlIntent(
            id="c", work_id="w", execution_id=claim.execution.id, epoch=1,
            kind=ControlKind.INTERRUPT, created_at_ms=T0,
        )  # fmt: skip
        await a.create_control(intent)
        ledger = BudgetLedger(
            key="k", budget="b", unit="usd", subject="all", window_start_ms=0, used=1.5
        )
        await a.update_ledger("k", lambda _: ledger)
        generation = await a.record_config_generation("d", now_ms=T0)
        routine = Routine(
            id="r", scope="root", target=WorkTemplate(binding="b"), cron_spec="* * * * *",
            created_at_ms=T0, updated_at_ms=T0,
        )  # fmt: skip
        await a.put_routine(routine)
    finally:
        await a.aclose()
    b = await store_factory.open()
    try:
        assert (await b.get_work("w")).last_attempt == 1
        assert await b.get_execution(claim.execution.id) == claim.execution
        assert await b.get_lease(claim.execution.id) == claim.lease
        assert [e.id for e in await b.pending_inputs("w")] == ["ev-2"]
        assert (await b.get_event("ev-1")).pending is False
        assert await b.due_timers(now_ms=T0) == [timer]
        assert await b.list_holds("other") == [hold]
        assert await b.matching_waits(event_type="e", correlation_key=None) == [wait]
        assert await b.get_control("c") == intent
        assert await b.get_ledger("k") == ledger
        assert await b.latest_config_generation() == generation
        assert await b.get_routine("r") == routine
        assert [w.id for w in await b.list_work()] == ["other", "w"]
    finally:
        await b.aclose()


# --- Several processes ----------------------------------------------------------------------
# Racers hold what they claim until every racer of the round has claimed (see _race), so their
# live windows overlap for real; tests/storage/test_race.py shows each check failing with its
# protection switched off.


async def test_one_live_attempt_per_work_across_processes(store_factory: StoreFactory) -> None:
    if store_factory.url is None:
        pytest.skip("the backend gives no URL another process can open")
    handle = await store_factory.open()
    work_ids = [f"w{i}" for i in range(3)]
    try:
        for work_id in work_ids:
            await handle.create_work(make_work(work_id), first_input=_event(work_id))
        windows = await anyio.to_thread.run_sync(
            lambda: run_race(store_factory.url or "", work_ids, mode="pick", processes=4, rounds=8)
        )
        check_no_overlap(windows)
        assert len(windows) >= 8, "fewer claims than rounds: the race claimed nothing"
        for work_id in work_ids:
            stored = [e.attempt for e in await handle.list_executions(work_id)]
            assert stored == list(range(1, len(stored) + 1))
            assert sorted(a for w, a, _, _ in windows if w == work_id) == stored
        assert await handle.live_executions() == []
    finally:
        await handle.aclose()


async def test_capacity_never_exceeded_across_processes(store_factory: StoreFactory) -> None:
    """Four processes claim ready Work at once against a limit of 3, holding what they got."""
    if store_factory.url is None:
        pytest.skip("the backend gives no URL another process can open")
    handle = await store_factory.open()
    try:
        for i in range(6):
            await handle.create_work(make_work(f"w{i}"), first_input=_event(f"w{i}"))
        rounds = 8
        windows = await anyio.to_thread.run_sync(
            lambda: run_race(
                store_factory.url or "", [], mode="ready", processes=4, rounds=rounds, limit=3
            )
        )
        assert max_overlap(windows) <= 3, f"{max_overlap(windows)} attempts live, limit 3"
        check_no_overlap(windows)
        # Not vacuous: every round filled the pool (3 claims, the fourth racer refused).
        assert len(windows) == 3 * rounds
        assert await handle.live_executions() == []
    finally:
        await handle.aclose()
