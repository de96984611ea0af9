"""Controls: inject settlements and races, interrupt, cancellation (reference evidence)."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.errors import CapacityError
from conduit_core.model import ControlStatus, ExecutionStatus, TimerKind, WorkStatus
from conduit_core.runtime import Attempt, ManualClock, Scheduler
from conduit_core.storage import NotEligibleError, Store
from conduit_test_plugin import scripted

from .conftest import submit

pytestmark = pytest.mark.anyio


async def running(sched: Scheduler, binding: str = "agent", **script: object) -> Attempt:
    scripted.BARRIERS.setdefault("run", anyio.Event())
    work = await submit(sched, binding, {"block": "run", **script})
    attempt = await sched.start(work.id)
    assert isinstance(attempt, Attempt)
    return attempt


async def test_inject_is_acknowledged_as_accepted_not_consumed(
    scheduler: Scheduler, store: Store
) -> None:
    attempt = await running(scheduler)
    event, intent = await scheduler.inject(attempt.execution.work_id, {"more": 1})
    assert intent is not None
    assert await scheduler.dispatch_controls() == 1
    assert (await store.get_control(intent.id)).status is ControlStatus.ACKNOWLEDGED
    assert ("inject", attempt.execution.id, 1, [event.id]) in scripted.CALLS
    # Accepted, not consumed: the input is still pending for a later presentation.
    assert [e.id for e in await store.pending_inputs(attempt.execution.work_id)] == [event.id]


async def test_dispatching_an_intent_read_before_its_settle_is_a_quiet_no_op(
    scheduler: Scheduler, store: Store
) -> None:
    # A host read the open intents, then the dispatch before it settled this one: the stale
    # copy is not dispatched again (no second call, no error), whatever its kind.
    attempt = await running(scheduler)
    _, intent = await scheduler.inject(attempt.execution.work_id, {"more": 1})
    assert intent is not None
    [stale] = await scheduler.open_controls()
    assert await scheduler.dispatch_control(stale) == 1
    calls = list(scripted.CALLS)
    assert await scheduler.dispatch_control(stale) == 0
    assert calls == scripted.CALLS
    assert (await store.get_control(intent.id)).status is ControlStatus.ACKNOWLEDGED


async def test_inject_keeps_the_event_type_and_correlation_key(
    scheduler: Scheduler, store: Store
) -> None:
    attempt = await running(scheduler)
    event, _ = await scheduler.inject(
        attempt.execution.work_id, {"n": 1}, event_type="review.comment", correlation_key="pr-7"
    )
    stored = await store.get_event(event.id)
    assert (stored.type, stored.correlation_key, stored.pending) == ("review.comment", "pr-7", True)


async def test_a_results_consumed_inputs_settle_the_intent_even_mid_dispatch(
    scheduler: Scheduler, store: Store
) -> None:
    attempt = await running(scheduler)
    work_id = attempt.execution.work_id
    event, intent = await scheduler.inject(work_id, {"more": 1})
    assert intent is not None
    # A dispatcher claimed the intent (its ack is in flight) when the result lands.
    claimed = await store.claim_control(intent.id, now_ms=0)
    attempt.handle.script["consumed"] = [event.id]  # type: ignore[attr-defined]
    scripted.BARRIERS["run"].set()
    done = await scheduler.observe(attempt)
    assert done.status is ExecutionStatus.COMPLETED
    assert (await store.get_control(intent.id)).status is ControlStatus.CONSUMED
    assert await store.pending_inputs(work_id) == []
    # The late acknowledgement with the old token cannot overwrite the settlement.
    from conduit_core.storage import StaleDispatchError

    with pytest.raises(StaleDispatchError):
        await store.settle_control(
            intent.id, claimed.dispatch_token or "", ControlStatus.ACKNOWLEDGED, now_ms=0
        )
    assert (await store.get_work(work_id)).status is WorkStatus.COMPLETED


async def test_not_accepting_settles_without_retry_and_keeps_the_input(
    scheduler: Scheduler, store: Store
) -> None:
    attempt = await running(scheduler)
    scripted.INJECT_ANSWER["value"] = "not_accepting"
    event, intent = await scheduler.inject(attempt.execution.work_id, {"more": 1})
    assert intent is not None
    await scheduler.dispatch_controls()
    assert (await store.get_control(intent.id)).status is ControlStatus.NOT_ACCEPTING
    assert await store.open_controls() == []  # never retried
    assert [e.id for e in await store.pending_inputs(attempt.execution.work_id)] == [event.id]


@pytest.mark.parametrize(("fallback", "status", "kept"), [
    ("queue", ControlStatus.FAILED, True), ("drop", ControlStatus.DROPPED, False),
])  # fmt: skip
async def test_pinned_error_fallback_is_recorded_without_provider_text(
    make_scheduler,
    store: Store,
    fallback: str,
    status: ControlStatus,
    kept: bool,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(
        bindings={"agent": Binding(executor="scripted", control_fallback=fallback)}
    )
    attempt = await running(sched)
    scripted.INJECT_ANSWER["value"] = "error"
    event, intent = await sched.inject(attempt.execution.work_id, {"more": 1})
    assert intent is not None
    await sched.dispatch_controls()
    settled = await store.get_control(intent.id)
    assert settled.status is status
    assert "secret provider text" not in repr(settled)
    pending = [e.id for e in await store.pending_inputs(attempt.execution.work_id)]
    assert pending == ([event.id] if kept else [])


async def test_intent_for_a_launching_attempt_waits(scheduler: Scheduler, store: Store) -> None:
    work = await submit(scheduler, "agent", {"block": "run"})
    claim = await scheduler.claim(work.id)  # claimed, still launching
    assert claim.execution.status is ExecutionStatus.LAUNCHING
    _, intent = await scheduler.inject(work.id, {"more": 1})
    assert intent is not None
    assert await scheduler.dispatch_controls() == 0
    assert (await store.get_control(intent.id)).status is ControlStatus.PENDING


async def test_a_newer_registration_cannot_grant_inject_to_an_older_attempt(
    scheduler: Scheduler, store: Store
) -> None:
    import msgspec

    from conduit_core.storage import ClaimRequest

    # An attempt pinned under a registration that had no inject capability ...
    work = await submit(scheduler, "agent", {"block": "run"})
    snapshot = scheduler.snapshot_for(await store.get_work(work.id))
    older = msgspec.structs.replace(
        snapshot, capabilities=[c for c in snapshot.capabilities if c != "inject"]
    )
    claim = await store.claim_attempt(
        ClaimRequest(work_id=work.id, snapshot=older),
        owner="t",
        now_ms=scheduler.clock.now_ms(),
        lease_ms=60_000,
    )
    scripted.BARRIERS["run"] = anyio.Event()
    await scheduler.launch(claim)
    # ... keeps that pin although the installed registration declares inject today: the input
    # is queued for the next attempt and no intent is dispatched to the old one.
    _, intent = await scheduler.inject(work.id, {"more": 1})
    assert intent is None
    assert await scheduler.dispatch_controls() == 0
    assert not [c for c in scripted.CALLS if c[0] == "inject"]


async def test_interrupt_fences_leaves_work_ready_and_holds_until_verified(
    make_scheduler,
    store: Store,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(concurrency=1)
    attempt = await running(sched)
    work_id = attempt.execution.work_id
    scripted.STOP_VERIFIED["value"] = False
    intent = await sched.interrupt(work_id)
    fenced = await store.get_execution(attempt.execution.id)
    assert fenced.status is ExecutionStatus.CANCELLED
    assert fenced.failure_code == "interrupted"
    assert (await store.get_work(work_id)).status is WorkStatus.READY
    # The old attempt's writes are refused from now on.
    from conduit_core.errors import LeaseLostError

    with pytest.raises(LeaseLostError):
        await store.persist_recovery(attempt.lease, {}, now_ms=0)
    # The interrupt was sent but the stop is not verified: the slot stays held.
    await sched.dispatch_controls()
    assert (await store.get_control(intent.id)).status is ControlStatus.FAILED
    other = await submit(sched, "agent", {})
    with pytest.raises(CapacityError):
        await sched.claim(other.id)
    scripted.STOP_VERIFIED["value"] = True
    assert await sched.confirm_unexcluded() == 1
    await sched.claim(other.id)


async def test_interrupt_with_nothing_running_is_refused(scheduler: Scheduler) -> None:
    work = await submit(scheduler, "agent", {})
    with pytest.raises(NotEligibleError):
        await scheduler.interrupt(work.id)


async def test_cancellation_fences_attempt_waits_and_timers_then_stops(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # A Work backing off (retry timer armed) with a parked attempt elsewhere ...
    failing = await submit(scheduler, "agent", {"outcome": "failed"})
    await scheduler.run_attempt(await scheduler.claim(failing.id))
    assert [t.kind for t in await store.due_timers(now_ms=clock.now_ms() + 10**10)] == [
        TimerKind.RETRY
    ]
    await scheduler.cancel_work(failing.id)
    assert await store.due_timers(now_ms=clock.now_ms() + 10**10) == []
    assert (await store.get_work(failing.id)).status is WorkStatus.CANCELLED
    # ... and a running one: fenced at once, then its resources stopped and confirmed.
    attempt = await running(scheduler)
    await scheduler.cancel_work(attempt.execution.work_id)
    ended = await store.get_execution(attempt.execution.id)
    assert ended.status is ExecutionStatus.CANCELLED
    assert ended.exclusion_confirmed
    assert ("stop", attempt.execution.id, 1, None) in scripted.CALLS
    with pytest.raises(NotEligibleError):
        await scheduler.claim(attempt.execution.work_id)
