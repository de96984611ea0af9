"""Recovery and relaunch, resource exclusion and generation pinning (reference evidence)."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.errors import CapacityError, LeaseLostError
from conduit_core.model import Execution, ExecutionStatus, Invoke
from conduit_core.runtime import Attempt, ManualClock, Scheduler
from conduit_core.storage import Store, open_store
from conduit_test_plugin import scripted

from .conftest import eventually, submit

pytestmark = pytest.mark.anyio

LEASE = 60_000


async def lose_lease_mid_launch(
    sched: Scheduler, clock: ManualClock, binding: str, script: dict
) -> Execution:  # type: ignore[type-arg]
    """Start an attempt whose launch blocks, then let its (unrenewed) lease expire."""
    scripted.BARRIERS.setdefault("stuck", anyio.Event())
    work = await submit(sched, binding, {**script, "block_run": "stuck"})
    claim = await sched.claim(work.id)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_swallow_lease_loss, sched, claim)
        # Wait (bounded) until the launch reached the executor, then walk away from it.

        async def executor_called() -> bool:
            return any(c[0] == "run" and c[1] == claim.execution.id for c in scripted.CALLS)

        await eventually(executor_called)
        tg.cancel_scope.cancel()
    clock.advance(LEASE + 1)
    return await sched.store.get_execution(claim.execution.id)


async def _swallow_lease_loss(sched: Scheduler, claim) -> None:  # type: ignore[no-untyped-def]
    with contextlib.suppress(LeaseLostError):
        await sched.launch(claim)


async def recover_one(sched: Scheduler) -> Execution:
    (claim,) = await sched.recover_expired()
    assert claim.execution.status is ExecutionStatus.RECOVERING
    return await sched.run_recovery(claim)


async def test_same_attempt_recovery_adopts_and_fences_the_old_epoch(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(scheduler, "agent", {"block": "later"})
    attempt = await scheduler.start(work.id)  # launched and running; nobody holds the lease
    assert isinstance(attempt, Attempt)
    lost_at = clock.advance(LEASE + 1)
    (claim,) = await scheduler.recover_expired()
    recovered = claim.execution
    assert (recovered.id, recovered.attempt, recovered.epoch) == (attempt.execution.id, 1, 2)
    old, new = recovered.segments[-2:]
    assert old.ended_at_ms == new.started_at_ms == lost_at  # no gap
    assert new.recovered
    assert recovered.snapshot.deadline_ms == attempt.execution.snapshot.deadline_ms
    # The old holder is fenced: its writes and renewals are refused.
    with pytest.raises(LeaseLostError):
        await store.persist_recovery(attempt.lease, {"late": True}, now_ms=clock.now_ms())
    with pytest.raises(LeaseLostError):
        await store.renew_lease(attempt.lease, now_ms=clock.now_ms())
    scripted.BARRIERS["later"].set()
    done = await scheduler.run_recovery(claim)
    assert done.status is ExecutionStatus.COMPLETED
    assert [c[0] for c in scripted.CALLS] == ["run", "recover"]  # adopted, never run twice
    assert done.result is not None
    assert done.result.summary == "recovered completed"


async def test_relaunch_of_a_launch_that_never_called_its_executor(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, "agent", {"outcome": "completed"})
    claim = await scheduler.claim(work.id)  # claimed; the host died before launching
    assert claim.execution.segments[-1].invoke is Invoke.PENDING
    clock.advance(LEASE + 1)
    done = await recover_one(scheduler)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.segments[-1].relaunched
    assert [(c[0], c[2]) for c in scripted.CALLS] == [("run", 2)]
    after = await store.get_work(work.id)
    assert (after.failure_count, after.last_attempt) == (0, 1)  # nothing failed, no retry spent
    # The old epoch's writes are refused.
    with pytest.raises(LeaseLostError):
        await store.persist_recovery(claim.lease, {"late": True}, now_ms=clock.now_ms())


async def test_relaunch_of_an_isolated_launch_that_pinned_nothing(
    scheduler: Scheduler, clock: ManualClock
) -> None:
    lost = await lose_lease_mid_launch(scheduler, clock, "job", {"outcome": "completed"})
    assert lost.segments[-1].invoke is Invoke.CALLED
    assert lost.segments[-1].isolated
    assert lost.segments[-1].pin is None
    scripted.BARRIERS["stuck"].set()
    done = await recover_one(scheduler)
    assert done.segments[-1].relaunched
    assert [c[0] for c in scripted.CALLS] == ["run", "run"]


@pytest.mark.parametrize(
    ("binding", "script", "why"),
    [
        ("job", {"pin": "container-1"}, "lease lost after the pin"),
        ("agent", {}, "unisolated launch whose executor was called before recording metadata"),
    ],
)
async def test_adoption_when_something_may_be_running(
    scheduler: Scheduler,
    clock: ManualClock,
    binding: str,
    script: dict,
    why: str,  # type: ignore[type-arg]
) -> None:
    lost = await lose_lease_mid_launch(scheduler, clock, binding, script)
    assert lost.segments[-1].invoke is Invoke.CALLED, why
    scripted.BARRIERS["stuck"].set()
    done = await recover_one(scheduler)
    assert not done.segments[-1].relaunched, why
    assert [c[0] for c in scripted.CALLS] == ["run", "recover"], why


async def test_adoption_of_an_unisolated_launch_that_recorded_metadata(
    scheduler: Scheduler, clock: ManualClock
) -> None:
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(scheduler, "agent", {"block": "later"})
    attempt = await scheduler.start(work.id)
    assert isinstance(attempt, Attempt)
    assert attempt.execution.recovery == {"how": "ran", "epoch": 1}
    clock.advance(LEASE + 1)
    scripted.BARRIERS["later"].set()
    done = await recover_one(scheduler)
    assert not done.segments[-1].relaunched
    recover_call = next(c for c in scripted.CALLS if c[0] == "recover")
    assert recover_call[3] == {"how": "ran", "epoch": 1}  # the executor got its metadata back


async def test_a_segment_with_no_invoke_record_is_adopted(
    scheduler: Scheduler, clock: ManualClock
) -> None:
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(scheduler, "agent", {"block": "later"})
    await scheduler.start(work.id)
    clock.advance(LEASE + 1)
    (first,) = await scheduler.recover_expired()  # a recovered segment: no invoke record
    assert first.execution.segments[-1].invoke is None
    clock.advance(LEASE + 1)  # ... and that recovery host died too
    scripted.BARRIERS["later"].set()
    done = await recover_one(scheduler)
    assert done.epoch == 3
    assert [c[0] for c in scripted.CALLS] == ["run", "recover"]


async def test_resource_hold_counts_across_a_restart_until_confirm_stopped(
    make_scheduler,
    store_url: str,
    clock: ManualClock,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(job_concurrency=1)
    scripted.STOP_VERIFIED["value"] = False
    work = await submit(sched, "job", {"no_persist": True})
    ended = await sched.run_attempt(await sched.claim(work.id))
    assert not ended.exclusion_confirmed
    async with await open_store(store_url) as reopened:  # a restarted daemon
        restarted: Scheduler = make_scheduler(store_=reopened, job_concurrency=1)
        waiting = await submit(restarted, "job", {})
        with pytest.raises(CapacityError):
            await restarted.claim(waiting.id)
        assert await restarted.confirm_unexcluded() == 0  # stop not verified: still held
        scripted.STOP_VERIFIED["value"] = True
        assert await restarted.confirm_unexcluded() == 1
        await restarted.claim(waiting.id)


async def test_confirmation_is_refused_for_a_re_adopted_attempt(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(scheduler, "agent", {"block": "later"})
    attempt = await scheduler.start(work.id)
    assert isinstance(attempt, Attempt)
    clock.advance(LEASE + 1)
    await scheduler.recover_expired()  # adopted at epoch 2 since
    with pytest.raises(LeaseLostError):
        await store.confirm_stopped(attempt.execution.id, 1, now_ms=clock.now_ms())
    # adoptable() tells the old host the attempt still belongs to recovery: don't stop it.
    assert await store.adoptable(attempt.lease)
    assert not await scheduler.handle_lost_lease(attempt.lease)
    assert not [c for c in scripted.CALLS if c[0] == "stop"]


async def test_recovery_uses_the_pinned_historical_generation(
    make_scheduler,
    store: Store,
    clock: ManualClock,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(
        bindings={"old": Binding(executor="echo", generation=1), "new": Binding(executor="echo")}
    )
    for binding, expected in (("old", 1), ("new", 2)):
        work = await submit(sched, binding, {"x": 1})
        claim = await sched.claim(work.id)
        assert claim.execution.snapshot.executor_generation == expected
        await sched.launch(claim)
        clock.advance(LEASE + 1)
        done = await recover_one(sched)
        assert done.result is not None
        assert done.result.summary == f"echo generation {expected} recovered"


async def test_old_host_stops_and_confirms_only_when_not_adoptable(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, "agent", {"no_persist": True})
    attempt = await scheduler.claim(work.id)
    ended = await scheduler.run_attempt(attempt)  # ends without acknowledgement: hold kept
    assert ended.status is ExecutionStatus.FAILED
    assert not await store.adoptable(attempt.lease)
    assert await scheduler.handle_lost_lease(attempt.lease)
    assert (await store.get_execution(ended.id)).exclusion_confirmed


async def test_an_attempt_keeps_its_last_50_segments_and_sums_the_dropped(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # The spec: "An attempt keeps its last 50 segments (MaxSegments)".
    kept = 50

    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(scheduler, "agent", {"block": "later"})
    await scheduler.start(work.id)
    for _ in range(kept + 5):  # every lost lease begins a recovered segment
        clock.advance(LEASE + 1)
        (claim,) = await scheduler.recover_expired()
    execution = claim.execution
    assert len(execution.segments) == kept
    assert execution.dropped_segments == 6  # 1 first + 55 recovered = 56 segments
    assert execution.dropped_active_ms == 6 * (LEASE + 1)
    # The kept ones are the newest, back to back: each begins where the previous ended.
    for before, after in zip(execution.segments, execution.segments[1:], strict=False):
        assert after.started_at_ms == before.ended_at_ms
    assert execution.segments[-1].epoch == kept + 6
