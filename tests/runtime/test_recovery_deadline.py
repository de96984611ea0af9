"""Recovery past the attempt's deadline never relaunches it (invariant 11), and a held attempt's
deadline is enforced while it is held.

Past the deadline: a launch that never called its executor is timed out (nothing to stop); any
other is adopted when the pinned generation finds it (a job that already ended is settled by its
result), and otherwise stopped through its executor and timed out only when the stop is
verified — held, saying so, when it is not. Runs on both stores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.errors import LeaseLostError
from conduit_core.model import Execution, ExecutionStatus, Invoke, WorkStatus
from conduit_core.runtime import Attempt, ManualClock, Scheduler
from conduit_core.runtime._attempts import LATE_LOOK_S
from conduit_core.storage import Store
from conduit_test_plugin import scripted

from .conftest import BINDINGS, submit

pytestmark = pytest.mark.anyio

LEASE = 60_000
TIMEOUT = 3_600_000  # the default timeout
RETRY = 30_000


def calls(kind: str) -> int:
    return sum(1 for c in scripted.CALLS if c[0] == kind)


async def recover_one(sched: Scheduler) -> Execution:
    (claim,) = await sched.recover_expired()
    return await sched.run_recovery(claim)


async def lost_in_run(sched: Scheduler, binding: str) -> str:
    """An attempt whose executor was called and never returned before its host vanished."""
    scripted.BARRIERS["stuck"] = anyio.Event()
    work = await submit(sched, binding, {"block_run": "stuck"})
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
    return work.id


def assert_timed_out(ex: Execution, *, confirmed: bool) -> None:
    assert ex.status is ExecutionStatus.TIMED_OUT, ex
    assert ex.failure_code == "timeout"
    assert ex.exclusion_confirmed is confirmed
    assert not any(s.relaunched for s in ex.segments)


async def test_a_claim_launched_past_its_deadline_calls_no_executor(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    """A host stalled (paused) between claim and launch past the deadline: launching would start
    the job only to stop it, and the retry would run it again. Timed out, nothing called."""
    work = await submit(scheduler, "quick", {})  # a 0.3 s timeout, well inside its lease
    claim = await scheduler.claim(work.id)
    clock.advance(300)
    done = await scheduler.launch(claim)
    assert isinstance(done, Execution)
    assert_timed_out(done, confirmed=True)
    assert "deadline passed before its launch" in (done.failure_message or "")
    assert scripted.CALLS == []
    assert done.segments[-1].invoke is Invoke.PENDING
    retry = await store.get_work(work.id)
    assert retry.status is WorkStatus.READY  # its retry runs it, once


async def test_a_launch_that_never_called_its_executor_is_timed_out_not_relaunched(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work = await submit(scheduler, "agent", {})
    claim = await scheduler.claim(work.id)  # the host died before launching
    assert claim.execution.segments[-1].invoke is Invoke.PENDING
    clock.advance(TIMEOUT + 1)
    done = await recover_one(scheduler)
    assert_timed_out(done, confirmed=True)  # nothing ran, nothing to stop
    assert done.snapshot.deadline_ms == claim.execution.snapshot.deadline_ms  # kept
    assert "executor was never called" in (done.failure_message or "")
    assert scripted.CALLS == []
    after = await store.get_work(work.id)
    assert after.failure_count == 1
    assert after.retry_timer_id is not None  # the retry runs the job, once


@pytest.mark.parametrize("verified", [True, False])
async def test_an_isolated_launch_past_its_deadline_is_stopped_not_relaunched(
    scheduler: Scheduler, store: Store, clock: ManualClock, verified: bool
) -> None:
    work_id = await lost_in_run(scheduler, "job")  # isolated, nothing pinned
    scripted.BARRIERS["stuck"].set()
    scripted.STOP_VERIFIED["value"] = verified
    clock.advance(TIMEOUT + 1)
    done = await recover_one(scheduler)
    assert [c[0] for c in scripted.CALLS] == ["run", "stop"]
    if verified:
        assert_timed_out(done, confirmed=True)
        return
    # The stop was not verified: held, saying why; nothing fails, nothing retries.
    assert done.status is ExecutionStatus.RECOVERING
    assert done.recovery_hold is not None
    assert done.recovery_hold.code == "recovery_past_deadline"
    assert "its stop was not verified" in done.recovery_hold.message
    assert (await store.get_work(work_id)).failure_count == 0


async def test_an_adopted_job_that_already_ended_is_settled_by_its_result(
    scheduler: Scheduler, clock: ManualClock
) -> None:
    work = await submit(scheduler, "agent", {})
    claim = await scheduler.claim(work.id)
    assert isinstance(await scheduler.launch(claim), Attempt)  # nobody observes it
    # It ended while nobody looked: the adopted handle has its result at once.
    scripted.BARRIERS["ended"] = anyio.Event()
    scripted.BARRIERS["ended"].set()
    scripted.RECOVER_ANSWER["value"] = "adopt_block:ended"
    clock.advance(TIMEOUT + 1)
    done = await recover_one(scheduler)
    assert done.status is ExecutionStatus.COMPLETED, done
    assert [c[0] for c in scripted.CALLS] == ["run", "recover"]


async def test_an_adopted_job_still_running_past_its_deadline_is_timed_out(
    scheduler: Scheduler, clock: ManualClock
) -> None:
    # Negative control of the case above: nothing to read, so it is stopped and timed out.
    work = await submit(scheduler, "agent", {})
    assert isinstance(await scheduler.launch(await scheduler.claim(work.id)), Attempt)
    scripted.RECOVER_ANSWER["value"] = "adopt_block:never"
    clock.advance(TIMEOUT + 1)
    with anyio.fail_after(LATE_LOOK_S + 10):  # the late look for a result it never gets
        done = await recover_one(scheduler)
    assert_timed_out(done, confirmed=True)
    assert [c[0] for c in scripted.CALLS] == ["run", "recover", "stop"]


async def test_not_started_past_the_deadline_is_timed_out_not_relaunched(
    scheduler: Scheduler, store: Store, clock: ManualClock
) -> None:
    work_id = await lost_in_run(scheduler, "agent")  # called, no metadata recorded
    scripted.BARRIERS["stuck"].set()
    scripted.RECOVER_ANSWER["value"] = "not_started"
    clock.advance(TIMEOUT + 1)
    done = await recover_one(scheduler)
    assert_timed_out(done, confirmed=True)
    assert [c[0] for c in scripted.CALLS] == ["run", "recover"]  # never run again
    assert (await store.get_work(work_id)).failure_count == 1


@pytest.mark.parametrize("answer", ["engine_unreachable", "not_started"])
@pytest.mark.parametrize("verified", [True, False])
async def test_unprovable_recovery_past_the_deadline_is_stopped(
    scheduler: Scheduler, store: Store, clock: ManualClock, answer: str, verified: bool
) -> None:
    # "not_started" after acknowledged metadata is a contradiction: as unprovable as any.
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(scheduler, "agent", {"block": "later"})
    assert isinstance(await scheduler.start(work.id), Attempt)
    scripted.RECOVER_ANSWER["value"] = answer
    scripted.STOP_VERIFIED["value"] = verified
    clock.advance(TIMEOUT + 1)
    done = await recover_one(scheduler)
    assert [c[0] for c in scripted.CALLS] == ["run", "recover", "stop"]
    if verified:
        assert_timed_out(done, confirmed=True)
        return
    assert done.recovery_hold is not None
    code = "recovery_contradicted" if answer == "not_started" else answer
    assert done.recovery_hold.code == code
    assert "its deadline has passed and its stop was not verified" in done.recovery_hold.message
    assert (await store.get_work(work.id)).failure_count == 0


@pytest.mark.parametrize("verified", [True, False])
async def test_a_held_attempt_is_stopped_at_its_deadline(
    make_scheduler: Callable[..., Scheduler],
    store: Store,
    clock: ManualClock,
    verified: bool,
) -> None:
    timeout_s = 80  # its deadline comes before the hold's backoff ends
    sched = make_scheduler(
        bindings={**BINDINGS, "short": Binding(executor="scripted", timeout_seconds=timeout_s)}
    )
    scripted.BARRIERS["later"] = anyio.Event()
    work = await submit(sched, "short", {"block": "later"})
    started = await sched.start(work.id)
    assert isinstance(started, Attempt)
    deadline = started.execution.snapshot.deadline_ms
    clock.advance(LEASE + 1)
    scripted.RECOVER_ANSWER["value"] = "engine_unreachable"
    held = await recover_one(sched)
    assert held.recovery_hold is not None
    # Tried again at its deadline, not a whole backoff later.
    assert held.recovery_hold.retry_at_ms == deadline < clock.now_ms() + RETRY
    clock.advance(deadline - clock.now_ms() - 1)
    assert await sched.recover_expired() == []  # not before its deadline
    clock.advance(1)
    scripted.STOP_VERIFIED["value"] = verified
    done = await recover_one(sched)
    assert calls("stop") == 1
    assert calls("run") == 1
    if verified:
        assert_timed_out(done, confirmed=True)
        assert (await store.get_work(work.id)).retry_timer_id is not None
        return
    # Not verified: it stays held (no failure, no retry), and its hold says so.
    assert done.status is ExecutionStatus.RECOVERING
    assert done.recovery_hold is not None
    assert done.recovery_hold.tries == 2
    assert "its stop was not verified" in done.recovery_hold.message
    after = await store.get_work(work.id)
    assert after.status is WorkStatus.RUNNING
    assert (after.failure_count, after.retry_timer_id) == (0, None)


@pytest.mark.parametrize("late", [True, False])
async def test_a_launch_lost_before_anything_started_past_its_deadline_is_timed_out(
    scheduler: Scheduler, store: Store, clock: ManualClock, late: bool
) -> None:
    # An executor program that died mid-launch, before anything started: past the deadline the
    # core times it out (nothing to stop) instead of failing it with its exclusion unconfirmed.
    release = scripted.BARRIERS["launching"] = anyio.Event()
    script = {"raise_run": "not_started", "block_run": "launching"}
    work = await submit(scheduler, "quick", script)  # a 0.3 s timeout
    claim = await scheduler.claim(work.id)
    ended: Execution | Attempt | None = None

    async def launch() -> None:
        nonlocal ended
        ended = await scheduler.launch(claim)

    async with anyio.create_task_group() as tg:
        tg.start_soon(launch)
        with anyio.fail_after(10):
            while calls("run") == 0:  # noqa: ASYNC110 - the executor is called in the task
                await anyio.sleep(0.01)
        if late:
            clock.advance(301)  # the deadline passes mid-launch, well within the lease
        release.set()
    assert isinstance(ended, Execution)
    if late:
        assert_timed_out(ended, confirmed=True)
    else:  # negative control: the launch failure it always was
        assert (ended.status, ended.failure_code) == (ExecutionStatus.FAILED, "not_started")
    assert calls("run") == 1
