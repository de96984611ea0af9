"""Capacity pools and scope limits, holding leases through slow launches, deadlines, waits."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.errors import CapacityError, LeaseLostError
from conduit_core.model import Event, ExecutionStatus, WorkStatus
from conduit_core.runtime import Attempt, Scheduler, SystemClock
from conduit_core.storage import Store, open_store
from conduit_test_plugin import scripted

from .conftest import submit

pytestmark = pytest.mark.anyio


async def _running(sched: Scheduler, binding: str, barrier: str) -> Attempt:
    scripted.BARRIERS.setdefault(barrier, anyio.Event())
    work = await submit(sched, binding, {"block": barrier})
    attempt = await sched.start(work.id)
    assert isinstance(attempt, Attempt)
    return attempt


async def test_executor_pools_do_not_take_each_others_slots(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    sched: Scheduler = make_scheduler(concurrency=1, job_concurrency=1)
    await _running(sched, "agent", "a")
    # The agent pool is full ...
    blocked = await submit(sched, "agent", {})
    with pytest.raises(CapacityError) as caught:
        await sched.claim(blocked.id)
    assert caught.value.code == "capacity_concurrency"
    # ... yet a due job still starts (and the reverse holds).
    await _running(sched, "job", "j")
    blocked_job = await submit(sched, "job", {})
    with pytest.raises(CapacityError) as caught_job:
        await sched.claim(blocked_job.id)
    assert caught_job.value.code == "capacity_job_concurrency"
    assert "jobs" in caught_job.value.message


async def test_scope_and_ancestor_limits_count_every_pool(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    sched: Scheduler = make_scheduler(
        scope_parents={"team": "root", "team-a": "team", "team-b": "team"},
        scope_limits={"team": 1},
    )
    await _running(sched, "job-team", "t")  # team-a, pool jobs
    other = await submit(sched, "agent-team", {})  # team-b, agent pool, same ancestor
    with pytest.raises(CapacityError) as caught:
        await sched.claim(other.id)
    assert caught.value.code == "capacity_scope"
    assert "team" in caught.value.message
    # Negative control: Work outside the limited subtree still starts.
    free = await submit(sched, "agent", {"outcome": "completed"})
    await sched.claim(free.id)


async def test_ended_attempt_holds_its_slot_until_exclusion_is_confirmed(
    make_scheduler,
    store: Store,
    clock,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(job_concurrency=1)
    work = await submit(sched, "job", {"no_persist": True})
    ended = await sched.run_attempt(await sched.claim(work.id))
    assert not ended.exclusion_confirmed
    waiting = await submit(sched, "job", {})
    with pytest.raises(CapacityError):
        await sched.claim(waiting.id)
    await store.confirm_stopped(ended.id, ended.epoch, now_ms=clock.now_ms())
    await sched.claim(waiting.id)


# A lease of 2 s renewed every 667 ms tolerates a renewal delayed by more than a second (a loaded
# CI machine); the launch still takes two and a half lease durations.
HELD_LEASE_MS = 2000
SLOW_LAUNCH_S = 5.0


async def test_held_launch_outlasts_its_lease(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    sched: Scheduler = make_scheduler(clock_=SystemClock(), lease_ms=HELD_LEASE_MS)
    work = await submit(sched, "job", {"launch_seconds": SLOW_LAUNCH_S, "outcome": "completed"})
    claim = await sched.claim(work.id)
    execution = await sched.run_attempt(claim)  # 2.5 lease durations, renewed every third
    assert execution.status is ExecutionStatus.COMPLETED


async def test_launch_without_a_holder_loses_its_lease(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    # Negative control: the same slow launch with nobody renewing loses the lease at its pin.
    sched: Scheduler = make_scheduler(clock_=SystemClock(), lease_ms=HELD_LEASE_MS)
    work = await submit(sched, "job", {"launch_seconds": SLOW_LAUNCH_S, "outcome": "completed"})
    with pytest.raises(LeaseLostError):
        await sched.launch(await sched.claim(work.id))


async def test_hold_ends_on_lost_lease(make_scheduler, store: Store) -> None:  # type: ignore[no-untyped-def]
    sched: Scheduler = make_scheduler(clock_=SystemClock(), lease_ms=600)
    scripted.BARRIERS["forever"] = anyio.Event()
    work = await submit(sched, "agent", {"block": "forever"})
    claim = await sched.claim(work.id)
    with anyio.fail_after(10), pytest.raises(LeaseLostError):  # noqa: PT012
        async with sched.hold(claim.lease):
            # Someone else's release makes the next renewal fail: the body is cancelled.
            await store.release_lease(claim.lease, now_ms=SystemClock().now_ms())
            await anyio.sleep_forever()


async def test_deadline_times_out_stops_and_keeps_unverified_hold(
    make_scheduler,
    store: Store,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(clock_=SystemClock())
    scripted.BARRIERS["never"] = anyio.Event()
    scripted.STOP_VERIFIED["value"] = False
    work = await submit(sched, "quick", {"block": "never"})
    with anyio.fail_after(10):
        execution = await sched.run_attempt(await sched.claim(work.id))
    assert execution.status is ExecutionStatus.TIMED_OUT
    assert execution.failure_code == "timeout"
    assert execution.snapshot.timeout_seconds == 0.3  # the binding's timeout is pinned
    assert not execution.exclusion_confirmed
    assert ("stop", execution.id, 1, None) in scripted.CALLS
    assert (await store.get_work(work.id)).retry_timer_id is not None


async def test_blocked_executor_never_holds_the_store_lock(
    make_scheduler,
    store_url: str,
    clock,  # type: ignore[no-untyped-def]
) -> None:
    first: Scheduler = make_scheduler()
    scripted.BARRIERS["stuck"] = stuck = anyio.Event()
    blocked = await submit(first, "agent", {"block_run": "stuck"})
    async with await open_store(store_url) as other_store, anyio.create_task_group() as tg:
        other: Scheduler = make_scheduler(store_=other_store, owner="other-host")
        claim = await first.claim(blocked.id)
        tg.start_soon(first.run_attempt, claim)
        with anyio.fail_after(10):
            # While the first executor's run() blocks, another scheduler on its own handle keeps
            # claiming and completing Work.
            for _ in range(3):
                work = await submit(other, "agent", {"outcome": "completed"})
                done = await other.run_attempt(await other.claim(work.id))
                assert done.status is ExecutionStatus.COMPLETED
        stuck.set()


async def test_waiting_parks_frees_the_slot_and_a_matching_event_resumes(
    make_scheduler,
    store: Store,
    clock,  # type: ignore[no-untyped-def]
) -> None:
    sched: Scheduler = make_scheduler(concurrency=1)
    work = await submit(
        sched,
        "agent",
        {"outcome": "waiting", "wait": {"event_type": "approved", "correlation_key": "k1"}},
    )
    parked = await sched.run_attempt(await sched.claim(work.id))
    assert parked.status is ExecutionStatus.PARKED
    assert parked.remaining_budget_ms is not None
    assert parked.remaining_budget_ms > 0
    assert parked.segments[-1].ended_at_ms is not None
    assert (await store.get_work(work.id)).status is WorkStatus.WAITING
    # The slot is free while parked.
    other = await submit(sched, "agent", {"outcome": "completed"})
    await sched.run_attempt(await sched.claim(other.id))
    # A non-matching key does not wake it.
    _, none = await sched.accept_input(
        Event(
            id="e-k2", delivery_id="e-k2", type="approved", correlation_key="k2", accepted_at_ms=0
        )
    )
    assert none == []
    wake_payload = {"outcome": "completed"}
    _, resumed = await sched.accept_input(
        Event(id="e-k1", delivery_id="e-k1", type="approved", correlation_key="k1",
              payload=wake_payload, accepted_at_ms=clock.now_ms())
    )  # fmt: skip
    (claim,) = resumed
    assert claim.execution.epoch == 2
    done = await sched.run_resumed(claim)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.segments[-1].wake_event_id == "e-k1"
    assert [c[0] for c in scripted.CALLS] == ["run", "run", "resume"]
    assert (await store.get_work(work.id)).status is WorkStatus.COMPLETED


async def test_a_works_own_turn_event_never_wakes_it(make_scheduler, store: Store) -> None:  # type: ignore[no-untyped-def]
    sched: Scheduler = make_scheduler()
    waiting = await submit(
        sched, "agent",
        {"outcome": "waiting", "turn": "review", "wait": {"event_type": "core.execution.turn"}},
    )  # fmt: skip
    parked = await sched.run_attempt(await sched.claim(waiting.id))
    own = await store.get_event(f"turn/{parked.id}/1")
    _, resumed = await sched.accept_input(own)
    assert resumed == []
    # Negative control: another Work's turn event does wake it (a dependency).
    other = await submit(sched, "agent", {"turn": "approved"})
    other_done = await sched.run_attempt(await sched.claim(other.id))
    _, resumed = await sched.accept_input(await store.get_event(f"turn/{other_done.id}/1"))
    assert [c.execution.id for c in resumed] == [parked.id]


async def test_lease_keeper_holds_slow_launches_and_cancels_on_loss(
    make_scheduler, store: Store  # type: ignore[no-untyped-def]
) -> None:
    """The host's shared keeper gives the same guarantees as a hold's own renewal task."""
    sched: Scheduler = make_scheduler(clock_=SystemClock(), lease_ms=600)
    async with sched.keeping_leases():
        slow = await submit(sched, "job", {"launch_seconds": 1.8, "outcome": "completed"})
        done = await sched.run_attempt(await sched.claim(slow.id))
        assert done.status is ExecutionStatus.COMPLETED
        scripted.BARRIERS["forever"] = anyio.Event()
        work = await submit(sched, "agent", {"block": "forever"})
        claim = await sched.claim(work.id)
        with anyio.fail_after(10), pytest.raises(LeaseLostError):  # noqa: PT012
            async with sched.hold(claim.lease):
                await store.release_lease(claim.lease, now_ms=SystemClock().now_ms())
                await anyio.sleep_forever()
