"""The recovery decision table: what the pinned generation's ``recover`` answer does.

handle → adopted; NotStartedError → relaunched, nothing counted (held when the launch's recovery
metadata was acknowledged: the answer contradicts the store); ResourcesGoneError → a counted
failure with exclusion confirmed; anything else (an uninstalled generation too) → held: the
attempt stays unfinished, keeps its slot, its Work starts nothing, and only the generation's
recovery or a person's confirm-stopped for its epoch settles it. Runs on both stores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.errors import CapacityError, ConduitError, LeaseLostError
from conduit_core.model import Execution, ExecutionStatus, WorkStatus
from conduit_core.runtime import Attempt, ManualClock, Scheduler
from conduit_core.storage import Store
from conduit_test_plugin import scripted

from .conftest import submit

pytestmark = pytest.mark.anyio

LEASE = 60_000
RETRY = 30_000


async def running_then_lost(sched: Scheduler, clock: ManualClock, binding: str = "agent") -> str:
    """An attempt launched (recovery metadata persisted) whose host then vanished."""
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(sched, binding, {"block": "later"})
    attempt = await sched.start(work.id)
    assert isinstance(attempt, Attempt)
    clock.advance(LEASE + 1)
    return work.id


async def recover_one(sched: Scheduler) -> Execution:
    (claim,) = await sched.recover_expired()
    return await sched.run_recovery(claim)


def calls(kind: str) -> int:
    return sum(1 for c in scripted.CALLS if c[0] == kind)


async def called_then_lost(sched: Scheduler, clock: ManualClock) -> str:
    """An attempt whose executor was called and recorded no recovery metadata before its host
    vanished (the launch is stuck in ``run``)."""
    scripted.BARRIERS["stuck"] = anyio.Event()
    work = await submit(sched, "agent", {"block_run": "stuck"})
    claim = await sched.claim(work.id)
    async with anyio.create_task_group() as tg:

        async def launch() -> None:
            with contextlib.suppress(LeaseLostError):
                await sched.launch(claim)

        tg.start_soon(launch)
        with anyio.fail_after(10):
            while calls("run") == 0:  # noqa: ASYNC110 - the executor is called in the task
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    clock.advance(LEASE + 1)
    return work.id


async def test_not_started_relaunches_without_counting_a_failure(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work_id = await called_then_lost(scheduler, clock)
    scripted.RECOVER_ANSWER["value"] = "not_started"
    scripted.BARRIERS["stuck"].set()
    done = await recover_one(scheduler)
    assert done.status is ExecutionStatus.COMPLETED
    assert (done.attempt, done.epoch) == (1, 2)  # the same attempt, relaunched
    assert done.segments[-1].relaunched
    assert [c[0] for c in scripted.CALLS] == ["run", "recover", "run"]
    work = await store.get_work(work_id)
    assert (work.failure_count, work.last_attempt, work.retry_timer_id) == (0, 1, None)


async def test_not_started_after_acknowledged_metadata_is_held(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # The launch's recovery metadata was acknowledged: "nothing started" contradicts the store.
    work_id = await running_then_lost(scheduler, clock)
    scripted.RECOVER_ANSWER["value"] = "not_started"
    scripted.BARRIERS["later"].set()
    held = await recover_one(scheduler)
    assert held.status is ExecutionStatus.RECOVERING
    assert held.recovery_hold is not None
    assert held.recovery_hold.code == "recovery_contradicted"
    assert "metadata was acknowledged" in held.recovery_hold.message
    assert not any(s.relaunched for s in held.segments)
    work = await store.get_work(work_id)
    assert work.status is WorkStatus.RUNNING
    assert (work.failure_count, work.retry_timer_id) == (0, None)
    # Asked again after the backoff, the same lie is held again: never a second run.
    clock.advance(RETRY)
    again = await recover_one(scheduler)
    assert again.recovery_hold is not None
    assert (again.recovery_hold.code, again.recovery_hold.tries) == ("recovery_contradicted", 2)
    assert calls("run") == 1


async def test_not_started_from_a_lost_observation_is_held(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # An executor (a restarted program) that loses the running segment and says nothing
    # started: the attempt goes to recovery at once, which holds it, never fails or reruns it.
    work = await submit(scheduler, "agent", {"raise_wait": "not_started"})
    handed = await scheduler.run_attempt(await scheduler.claim(work.id))
    assert handed.status is ExecutionStatus.RUNNING  # unfinished, its lease released
    scripted.RECOVER_ANSWER["value"] = "not_started"
    held = await recover_one(scheduler)  # at once: no lease to wait out
    assert held.recovery_hold is not None
    assert held.recovery_hold.code == "recovery_contradicted"
    assert (await store.get_work(work.id)).failure_count == 0
    assert calls("run") == 1


async def test_resources_gone_is_a_counted_failure_with_exclusion_confirmed(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work_id = await running_then_lost(scheduler, clock)
    scripted.RECOVER_ANSWER["value"] = "gone"
    done = await recover_one(scheduler)
    assert done.status is ExecutionStatus.FAILED
    assert done.failure_code == "resources_gone"
    assert done.exclusion_confirmed
    work = await store.get_work(work_id)
    assert work.failure_count == 1
    assert work.retry_timer_id is not None
    assert calls("run") == 1  # never relaunched as if nothing had run


@pytest.mark.parametrize("answer", ["engine_unreachable", "crash"])
async def test_cannot_tell_holds_the_attempt_and_blocks_its_work(
    make_scheduler: Callable[..., Scheduler], store: Store, clock: ManualClock, answer: str
) -> None:
    sched = make_scheduler(concurrency=1)
    work_id = await running_then_lost(sched, clock)
    scripted.RECOVER_ANSWER["value"] = answer
    held = await recover_one(sched)
    # Unfinished, not failed: no failure counted, no retry armed, its slot still taken.
    assert held.status is ExecutionStatus.RECOVERING
    hold = held.recovery_hold
    assert hold is not None
    code = answer if answer != "crash" else "recovery_failed"
    assert (hold.code, hold.epoch, hold.tries) == (code, 2, 1)
    assert f"conduit work confirm-stopped {work_id} --epoch 2" in hold.settle
    work = await store.get_work(work_id)
    assert work.status is WorkStatus.RUNNING
    assert (work.failure_count, work.retry_timer_id) == (0, None)
    other = await submit(sched, "agent", {})
    with pytest.raises(CapacityError):  # the held attempt still counts against the limit
        await sched.claim(other.id)
    assert [e.id for e in await store.held_recoveries()] == [held.id]
    # Not before its backoff; then tried again at the same epoch, and held again.
    assert await sched.recover_expired() == []
    clock.advance(RETRY)
    again = await recover_one(sched)
    assert again.recovery_hold is not None
    assert (again.epoch, again.recovery_hold.tries) == (2, 2)
    assert again.recovery_hold.since_ms == hold.since_ms
    assert calls("run") == 1  # nothing ever started a second run


async def test_a_removed_generation_holds_until_it_is_reinstalled(
    make_scheduler: Callable[..., Scheduler],
    store: Store,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched = make_scheduler(bindings={"old": Binding(executor="echo", generation=1)})
    work = await submit(sched, "old", {"x": 1})
    await sched.launch(await sched.claim(work.id))
    clock.advance(LEASE + 1)
    # The package was upgraded to one that no longer declares generation 1.
    echo_1 = sched.plugins.executor("echo", 1)
    monkeypatch.delitem(sched.plugins._executors, ("echo", 1))
    held = await recover_one(sched)
    assert held.status is ExecutionStatus.RECOVERING
    assert held.recovery_hold is not None
    assert held.recovery_hold.code == "unsupported_generation"
    assert "reinstall a package that declares executor 'echo' generation 1" in (
        held.recovery_hold.settle
    )
    assert (await store.get_work(work.id)).failure_count == 0
    # Reinstalled: a start (or reload) tries at once, and the pinned generation adopts it.
    monkeypatch.setitem(sched.plugins._executors, ("echo", 1), echo_1)
    (claim,) = await sched.retry_held_recoveries()
    assert claim.execution.epoch == 2
    done = await sched.run_recovery(claim)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.result is not None
    assert done.result.summary == "echo generation 1 recovered"
    assert done.recovery_hold is None


async def test_confirm_stopped_settles_a_held_attempt_for_its_epoch_only(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work_id = await running_then_lost(scheduler, clock)
    scripted.RECOVER_ANSWER["value"] = "engine_unreachable"
    held = await recover_one(scheduler)
    # Negative control: another epoch is refused and nothing changes.
    with pytest.raises(ConduitError) as refused:
        await scheduler.confirm_stopped(work_id, 1, by="test", reason="looked")
    assert refused.value.code == "epoch_mismatch"
    assert (await store.get_execution(held.id)).status is ExecutionStatus.RECOVERING
    assert not [e for e in await store.work_events(work_id) if "stop_confirmed" in e.type]
    done = await scheduler.confirm_stopped(work_id, 2, by="test", reason="host rebooted")
    assert done.status is ExecutionStatus.FAILED
    assert (done.failure_code, done.exclusion_confirmed) == ("stop_confirmed", True)
    assert done.recovery_hold is None
    work = await store.get_work(work_id)
    assert work.failure_count == 1
    assert work.retry_timer_id is not None
    (event,) = [e for e in await store.work_events(work_id) if "stop_confirmed" in e.type]
    assert event.type == "core.execution.stop_confirmed"
    assert event.payload["by"] == "test"
    assert event.payload["reason"] == "host rebooted"
    assert (event.payload["epoch"], event.payload["held"]) == (2, "engine_unreachable")
    with pytest.raises(ConduitError) as nothing:
        await scheduler.confirm_stopped(work_id, 2, by="test")
    assert nothing.value.code == "not_held"


async def test_an_unconfirmed_ended_attempt_blocks_the_next_until_confirmed(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    # Ends without acknowledgement: failed, the retry armed, its exclusion unconfirmed.
    work = await submit(scheduler, "agent", {"no_persist": True})
    ended = await scheduler.run_attempt(await scheduler.claim(work.id))
    assert ended.failure_code == "launch_unacknowledged"
    assert not ended.exclusion_confirmed
    scripted.STOP_VERIFIED["value"] = False
    assert await scheduler.confirm_unexcluded() == 0
    clock.advance(300_000)
    await scheduler.fire_due_timers()
    assert (await store.get_work(work.id)).status is WorkStatus.READY
    # The retry is due, but the first attempt may still run: no second one starts.
    with pytest.raises(ConduitError) as refused:
        await scheduler.claim(work.id)
    assert "waits for the stop of attempt" in refused.value.message
    claims, _ = await scheduler.claim_ready(10)
    assert claims == []
    await scheduler.confirm_stopped(work.id, ended.epoch, by="test", reason="checked")
    assert (await store.get_execution(ended.id)).exclusion_confirmed
    assert (await scheduler.claim(work.id)).execution.attempt == 2
