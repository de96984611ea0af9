"""``writes_first``: the invoke mark rides on the executor's first fenced write.

An executor that declares it promises a fenced context write before it starts anything, so the
core writes no mark of its own just before ``run``: a launch costs one store write fewer, and a
launch lost before that first write landed is provably unstarted (``pending``), so recovery
relaunches it at no cost. The ``scripted`` executor (no declaration) is the negative control:
its mark is written before ``run``, and the same loss is adopted.
"""

from __future__ import annotations

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.errors import LeaseLostError
from conduit_core.extension import PhaseOutcome
from conduit_core.model import Execution, ExecutionStatus, Invoke
from conduit_core.runtime import Attempt, ManualClock, Scheduler
from conduit_core.storage import Store
from conduit_test_plugin import scripted

from .conftest import BINDINGS, eventually, submit
from .test_recovery import LEASE, lose_lease_mid_launch, recover_one

pytestmark = pytest.mark.anyio

WITH_FIRST = {**BINDINGS, "first": Binding(executor="scripted-first")}


@pytest.fixture
def sched(make_scheduler) -> Scheduler:  # type: ignore[no-untyped-def]
    return make_scheduler(bindings=WITH_FIRST)


def _count_attempt_writes(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[Execution]:
    """Every fenced attempt write (``update_attempt``) from now on, with what it stored."""
    written: list[Execution] = []
    real = store.update_attempt

    async def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        stored = await real(*args, **kwargs)
        written.append(stored)
        return stored

    monkeypatch.setattr(store, "update_attempt", counting)
    return written


@pytest.mark.parametrize(("binding", "writes"), [("first", 1), ("agent", 2)])
async def test_the_invoke_mark_rides_on_the_executors_first_write(
    sched: Scheduler, store: Store, monkeypatch: pytest.MonkeyPatch, binding: str, writes: int
) -> None:
    work = await submit(sched, binding, {"block": "later"})
    claim = await sched.claim(work.id)
    written = _count_attempt_writes(store, monkeypatch)
    scripted.BARRIERS["later"] = anyio.Event()
    launched = await sched.launch(claim)
    assert isinstance(launched, Attempt)
    # writes_first: the executor's persist_recovery is the launch's only write; without it, the
    # core's mark comes first.
    assert len(written) == writes
    first = written[0].segments[-1]
    assert first.invoke is Invoke.CALLED
    assert [(p.name, p.outcome) for p in first.launch] == [
        ("environment", PhaseOutcome.OK),
        ("executor", None),
    ]
    assert written[-1].status is ExecutionStatus.RUNNING
    scripted.BARRIERS["later"].set()
    done = await sched.observe(launched)
    assert done.status is ExecutionStatus.COMPLETED


async def test_lost_before_its_first_write_it_is_relaunched_at_no_cost(
    sched: Scheduler, clock: ManualClock
) -> None:
    lost = await lose_lease_mid_launch(sched, clock, "first", {})
    assert lost.segments[-1].invoke is Invoke.PENDING  # nothing written: provably unstarted
    scripted.BARRIERS["stuck"].set()
    done = await recover_one(sched)
    assert done.status is ExecutionStatus.COMPLETED
    assert (done.attempt, done.epoch) == (1, 2)
    assert done.segments[-1].relaunched
    assert [c[0] for c in scripted.CALLS] == ["run", "run"]  # never recover: nothing to adopt
    work = await sched.store.get_work(done.work_id)
    assert (work.failure_count, work.retry_timer_id) == (0, None)


async def test_without_it_the_same_loss_is_adopted(sched: Scheduler, clock: ManualClock) -> None:
    lost = await lose_lease_mid_launch(sched, clock, "agent", {})
    assert lost.segments[-1].invoke is Invoke.CALLED  # the core's mark, before run
    scripted.BARRIERS["stuck"].set()
    done = await recover_one(sched)
    assert not done.segments[-1].relaunched
    assert [c[0] for c in scripted.CALLS] == ["run", "recover"]


async def test_a_late_first_write_is_refused_so_the_old_launch_starts_nothing(
    sched: Scheduler, clock: ManualClock
) -> None:
    """The old holder wakes after the relaunch: its first write is fenced out, and nothing of
    that launch starts (the core never wrote a mark it could have raced)."""
    old_barrier = scripted.BARRIERS["stuck"] = anyio.Event()
    work = await submit(sched, "first", {"block_run": "stuck"})
    claim = await sched.claim(work.id)
    outcome: list[BaseException | Attempt | Execution] = []

    async def old_launch() -> None:
        try:
            outcome.append(await sched.launch(claim))
        except LeaseLostError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(old_launch)

        async def runs(n: int) -> bool:
            return sum(c[0] == "run" for c in scripted.CALLS) == n

        await eventually(lambda: runs(1))
        clock.advance(LEASE + 1)
        (recovering,) = await sched.recover_expired()
        new_barrier = scripted.BARRIERS["stuck"] = anyio.Event()
        relaunch: list[Execution] = []

        async def recover() -> None:
            relaunch.append(await sched.run_recovery(recovering))

        tg.start_soon(recover)
        await eventually(lambda: runs(2))
        old_barrier.set()  # the old launch's first write now meets the new epoch

        async def old_ended() -> bool:
            return bool(outcome)

        await eventually(old_ended)
        new_barrier.set()
    (old,) = outcome
    assert isinstance(old, LeaseLostError)
    (done,) = relaunch
    assert done.status is ExecutionStatus.COMPLETED
    assert done.segments[-1].relaunched
    assert done.recovery == {"how": "ran", "epoch": 2}  # only the relaunch persisted
