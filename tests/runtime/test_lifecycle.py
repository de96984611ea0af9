"""Start, launch phases, outcomes, kinds, turns, environment: the scheduler's lifecycle."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.extension import PhaseOutcome
from conduit_core.model import Execution, ExecutionStatus, Invoke, WorkKind, WorkStatus
from conduit_core.runtime import Attempt, Scheduler
from conduit_core.storage import Store
from conduit_test_plugin import scripted

from .conftest import eventually, input_event, submit

pytestmark = pytest.mark.anyio


async def run(sched: Scheduler, work_id: str) -> Execution:
    return await sched.run_attempt(await sched.claim(work_id))


async def test_start_observe_complete_records_segment_and_phases(
    scheduler: Scheduler, store: Store
) -> None:
    work = await submit(scheduler, payload={"outcome": "completed", "units": {"minutes": 0.5}})
    execution = await run(scheduler, work.id)
    assert execution.status is ExecutionStatus.COMPLETED
    assert execution.attempt == 1
    assert execution.exclusion_confirmed
    assert execution.result is not None
    assert execution.result.usage.units == {"minutes": 0.5}
    assert execution.inputs == [f"{work.id}/in1"]
    (segment,) = execution.segments
    assert segment.invoke is Invoke.CALLED
    assert not segment.isolated
    assert segment.ended_at_ms is not None
    names = [(p.name, p.outcome) for p in segment.launch]
    assert names == [("environment", PhaseOutcome.OK), ("executor", PhaseOutcome.OK)]
    assert (await store.get_work(work.id)).status is WorkStatus.COMPLETED
    assert await store.live_executions() == []


async def test_launch_phases_of_the_executor_are_recorded_while_running(
    scheduler: Scheduler, store: Store
) -> None:
    scripted.BARRIERS["hold"] = barrier = anyio.Event()
    work = await submit(scheduler, "job", {"launch_seconds": 0, "block": "hold"})
    launched = await scheduler.start(work.id)
    assert isinstance(launched, Attempt)
    stored = await store.get_execution(launched.execution.id)
    assert stored.status is ExecutionStatus.RUNNING
    launch = stored.segments[-1].launch
    # The executor phase begins first; its inner steps are recorded inside it.
    assert [p.name for p in launch] == ["environment", "executor", "container_create"]
    assert [p.outcome for p in launch] == [PhaseOutcome.OK, None, PhaseOutcome.OK]
    assert stored.segments[-1].isolated  # scripted-job declares "isolated"
    async with anyio.create_task_group() as tg:
        observed: list[Execution] = []

        async def observe() -> None:
            observed.append(await scheduler.observe(launched))

        tg.start_soon(observe)
        # An attempt that keeps running gets its executor phase's end written while it runs.
        async def executor_phase_ended() -> bool:
            stored = await store.get_execution(launched.execution.id)
            return stored.segments[-1].launch[1].outcome is PhaseOutcome.OK

        await eventually(executor_phase_ended)
        barrier.set()
    assert observed[0].status is ExecutionStatus.COMPLETED


async def test_attempt_numbers_are_monotonic_across_retries(
    scheduler: Scheduler, store: Store
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed"})
    first = await run(scheduler, work.id)
    await scheduler.manual_retry(work.id)
    second = await run(scheduler, work.id)
    assert (first.attempt, second.attempt) == (1, 2)
    assert [e.attempt for e in await store.list_executions(work.id)] == [1, 2]


async def test_handoff_leaves_task_ready_and_settles_run_once(
    scheduler: Scheduler, store: Store
) -> None:
    task = await submit(scheduler, payload={"outcome": "handoff"})
    assert (await run(scheduler, task.id)).status is ExecutionStatus.HANDOFF
    assert (await store.get_work(task.id)).status is WorkStatus.READY
    once = await submit(scheduler, payload={"outcome": "handoff"}, kind=WorkKind.RUN_ONCE)
    await run(scheduler, once.id)
    assert (await store.get_work(once.id)).status is WorkStatus.COMPLETED


async def test_standing_work_returns_to_ready_and_hintless_failure_arms_nothing(
    scheduler: Scheduler, store: Store, clock
) -> None:  # type: ignore[no-untyped-def]
    standing = await submit(scheduler, payload={"outcome": "completed"}, kind=WorkKind.STANDING)
    await run(scheduler, standing.id)
    assert (await store.get_work(standing.id)).status is WorkStatus.READY
    await store.accept_event(input_event(standing.id, 2, {"outcome": "failed"}))
    await run(scheduler, standing.id)
    after = await store.get_work(standing.id)
    assert after.status is WorkStatus.READY
    assert after.retry_timer_id is None
    assert after.blocked_reason is None
    assert await store.due_timers(now_ms=clock.now_ms() + 10**9) == []
    # A hinted failure of standing Work backs off without exhausting it.
    await store.accept_event(
        input_event(standing.id, 3, {"outcome": "failed", "retry_hint": {"unknown_reset": True}})
    )
    await run(scheduler, standing.id)
    hinted = await store.get_work(standing.id)
    assert hinted.retry_timer_id is not None
    assert hinted.blocked_reason is None


async def test_completed_work_cannot_overtake_unrouted_input(
    scheduler: Scheduler, store: Store
) -> None:
    scripted.BARRIERS["slow"] = barrier = anyio.Event()
    work = await submit(scheduler, payload={"block": "slow"})
    launched = await scheduler.start(work.id)
    assert isinstance(launched, Attempt)
    await store.accept_event(input_event(work.id, 2, {"outcome": "completed"}))
    barrier.set()
    done = await scheduler.observe(launched)
    assert done.status is ExecutionStatus.COMPLETED
    after = await store.get_work(work.id)
    assert after.status is WorkStatus.READY, "input accepted mid-attempt must get its own attempt"
    second = await run(scheduler, work.id)
    assert second.inputs == [f"{work.id}/in2"]
    assert (await store.get_work(work.id)).status is WorkStatus.COMPLETED


async def test_turn_event_published_in_the_same_transition(
    scheduler: Scheduler, store: Store
) -> None:
    keyed = await submit(scheduler, payload={"turn": "review"}, keys=["pr-7", "ticket-9"])
    execution = await run(scheduler, keyed.id)
    for key in ("pr-7", "ticket-9"):
        event = await store.get_event(f"turn/{execution.id}/1/{key}")
        assert event.type == "core.execution.turn"
        assert event.correlation_key == key
        assert event.unmatched
        assert not event.pending
        assert event.payload["status"] == "review"
        assert event.payload["work"] == keyed.id
    keyless = await submit(scheduler, payload={"turn": "done", "outcome": "failed"})
    failed = await run(scheduler, keyless.id)
    assert (await store.get_event(f"turn/{failed.id}/1")).payload["status"] == "done"


async def test_invalid_turn_status_fails_the_attempt(scheduler: Scheduler) -> None:
    work = await submit(scheduler, payload={"turn": "Not A Word"})
    execution = await run(scheduler, work.id)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.failure_code == "invalid_result"


async def test_run_environment_reaches_the_executor_and_is_never_persisted(
    scheduler: Scheduler, store: Store
) -> None:
    work = await submit(scheduler, "env", {"outcome": "completed"})
    execution = await run(scheduler, work.id)
    (call,) = [c for c in scripted.CALLS if c[0] == "run"]
    assert call[3] == {"CONDUIT_TEST_ENV": "from-test-plugin"}
    stored = await store.get_execution(execution.id)
    assert "from-test-plugin" not in repr(stored)
    assert "from-test-plugin" not in repr(await store.get_work(work.id))


async def test_environment_failure_fails_before_the_executor_is_called(
    scheduler: Scheduler, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conduit_core.errors import ConduitError

    def broken(scope_chain: object) -> dict[str, str]:
        raise ConduitError("vault sealed", code="environment_unavailable")

    monkeypatch.setattr(scheduler.plugins, "run_environment", broken)
    work = await submit(scheduler, payload={"outcome": "completed"})
    execution = await run(scheduler, work.id)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.failure_code == "environment_unavailable"
    assert execution.segments[0].invoke is Invoke.PENDING
    assert execution.exclusion_confirmed
    assert [c for c in scripted.CALLS if c[0] == "run"] == []


async def test_missing_recovery_metadata_is_a_safe_failure_keeping_the_hold(
    scheduler: Scheduler, store: Store
) -> None:
    work = await submit(scheduler, "job", {"no_persist": True})
    execution = await run(scheduler, work.id)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.failure_code == "launch_unacknowledged"
    assert not execution.exclusion_confirmed
    assert [e.id for e in await store.unconfirmed_exclusions()] == [execution.id]


async def test_operation_error_code_and_message_kept_other_error_text_not(
    scheduler: Scheduler,
) -> None:
    work = await submit(scheduler, payload={"raise_wait": "quota_exceeded"})
    execution = await run(scheduler, work.id)
    assert execution.failure_code == "quota_exceeded"
    assert execution.failure_message == (
        "executor observation failed: quota_exceeded: scripted observation failure"
    )
