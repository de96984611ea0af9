"""Retry policy: delays, permanent failures, hints, manual retry, timers and exhaustion."""

from __future__ import annotations

import pytest

from conduit_core.model import Execution, ExecutionStatus, TimerKind, WorkStatus
from conduit_core.runtime import ManualClock, Scheduler
from conduit_core.storage import NotEligibleError, Store

from .conftest import submit

pytestmark = pytest.mark.anyio


async def run(sched: Scheduler, work_id: str) -> Execution:
    return await sched.run_attempt(await sched.claim(work_id))


async def test_permanent_failure_arms_no_retry(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed", "permanent": True})
    await run(scheduler, work.id)
    after = await store.get_work(work.id)
    assert after.blocked_reason == "permanent_failure"
    assert after.retry_timer_id is None
    assert await store.due_timers(now_ms=clock.now_ms() + 10**10) == []
    assert await store.ready_work(limit=10) == []


async def test_unmarked_failure_arms_the_first_delay(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # Negative control of the permanent case.
    work = await submit(scheduler, payload={"outcome": "failed"})
    failed_at = clock.now_ms()
    execution = await run(scheduler, work.id)
    after = await store.get_work(work.id)
    assert after.blocked_reason is None
    assert after.failure_count == 1
    (timer,) = await store.due_timers(now_ms=clock.now_ms() + 10**10)
    assert timer.kind is TimerKind.RETRY
    assert timer.due_at_ms == failed_at + 300_000
    assert timer.generation == 1
    assert timer.payload["trigger"] == execution.inputs


async def test_due_clock_alone_never_clears_eligibility(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed"})
    await run(scheduler, work.id)
    clock.advance(300_001)
    # The timer is due, but until it is fired the Work stays backing off.
    with pytest.raises(NotEligibleError):
        await scheduler.claim(work.id)
    assert await scheduler.fire_due_timers() == [f"retry/{work.id}#1"]
    assert await scheduler.fire_due_timers() == []  # exactly once
    claim = await scheduler.claim(work.id)
    assert [e.type for e in claim.inputs] == ["core.retry"]


async def test_retry_bounds_exhaust_after_the_configured_delays(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed"})
    timers = []
    for _ in range(2):
        await run(scheduler, work.id)
        (timer,) = await store.due_timers(now_ms=clock.now_ms() + 10**10)
        timers.append(timer.due_at_ms - clock.now_ms())
        clock.set(timer.due_at_ms)
        await scheduler.fire_due_timers()
    assert timers == [300_000, 600_000]
    third = await run(scheduler, work.id)
    assert third.attempt == 3
    after = await store.get_work(work.id)
    assert after.blocked_reason == "retry_exhausted"
    assert after.status is WorkStatus.READY  # not terminal without terminal_on_exhaustion
    assert await store.due_timers(now_ms=clock.now_ms() + 10**10) == []


async def test_terminal_on_exhaustion_fails_the_work(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, "terminal", {"outcome": "failed"})
    await run(scheduler, work.id)
    clock.advance(1000)
    await scheduler.fire_due_timers()
    await run(scheduler, work.id)
    assert (await store.get_work(work.id)).status is WorkStatus.FAILED


async def test_manual_retry_resets_budget_not_numbering(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed", "permanent": True})
    await run(scheduler, work.id)
    with pytest.raises(NotEligibleError):
        await scheduler.claim(work.id)
    await scheduler.manual_retry(work.id, reason="config fixed")
    after = await store.get_work(work.id)
    assert (after.failure_count, after.blocked_reason) == (0, None)
    claim = await scheduler.claim(work.id)
    assert claim.execution.attempt == 2
    assert [e.type for e in claim.inputs] == ["core.manual.retry"]
    assert claim.inputs[0].payload["trigger"] == [f"{work.id}/in1"]


async def test_manual_retry_is_refused_for_terminal_work(scheduler: Scheduler) -> None:
    work = await submit(scheduler, payload={"outcome": "completed"})
    await run(scheduler, work.id)
    from conduit_core.errors import ConduitError

    with pytest.raises(ConduitError) as caught:
        await scheduler.manual_retry(work.id)
    assert caught.value.code == "not_eligible"


async def test_unknown_reset_hint_waits_thirty_minutes(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(
        scheduler, payload={"outcome": "failed", "retry_hint": {"unknown_reset": True}}
    )
    await run(scheduler, work.id)
    (timer,) = await store.due_timers(now_ms=clock.now_ms() + 10**10)
    # The spec: "thirty minutes for an unknown reset".
    assert timer.due_at_ms - clock.now_ms() == 30 * 60_000
    assert (await store.get_work(work.id)).failure_count == 1  # a hint still consumes budget


async def test_past_hint_is_refused_explicitly(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed", "retry_hint": {"reset_at_ms": 1}})
    execution = await run(scheduler, work.id)
    assert execution.failure_message is not None
    assert "retry hint refused" in execution.failure_message
    assert "in the past" in execution.failure_message
    # The refused hint falls back to the ordinary first delay.
    (timer,) = await store.due_timers(now_ms=clock.now_ms() + 10**10)
    assert timer.due_at_ms - clock.now_ms() == 300_000


async def test_queued_input_during_backoff_does_not_clear_it(
    scheduler: Scheduler, store: Store
) -> None:
    from .conftest import input_event

    work = await submit(scheduler, payload={"outcome": "failed"})
    await run(scheduler, work.id)
    await store.accept_event(input_event(work.id, 2, {"outcome": "completed"}))
    with pytest.raises(NotEligibleError):
        await scheduler.claim(work.id)
    assert work.id not in {w.id for w in await store.ready_work(limit=10)}


async def test_plugin_retry_hint_applies_to_executor_errors(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # The test plugin's conduit_retry_hint answers "unknown reset" for the scripted executor's
    # rate_limited errors: thirty minutes, not the binding's first delay of five.
    work = await submit(scheduler, "agent", {"raise_wait": "rate_limited"})
    execution = await run(scheduler, work.id)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.failure_code == "rate_limited"
    (timer,) = await store.due_timers(now_ms=clock.now_ms() + 10**10)
    assert timer.due_at_ms - clock.now_ms() == 30 * 60_000
    assert (await store.get_work(work.id)).failure_count == 1


async def test_no_plugin_hint_keeps_the_bindings_delay(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # Negative control: an error the hook does not recognise gets the ordinary first delay.
    work = await submit(scheduler, "agent", {"raise_wait": "quota_exceeded"})
    await run(scheduler, work.id)
    (timer,) = await store.due_timers(now_ms=clock.now_ms() + 10**10)
    assert timer.due_at_ms - clock.now_ms() == 300_000
