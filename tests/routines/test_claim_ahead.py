"""Claim ahead: rows due within ``claim_ahead_ms`` are claimed before their instant and fired at
it, never before; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from conduit_core.errors import ConduitError
from conduit_core.model import Event, Routine, RoutineStatus, Work, WorkTemplate
from conduit_core.routines import ScheduleChange, ScheduleCreate
from conduit_core.routines.managed import ConduitRoutineSource
from conduit_core.routines.ticker import Ticker
from conduit_core.runtime import ManualClock, SystemClock
from conduit_core.storage import Store
from tests.routines.conftest import T0, StoreTarget, eventually

pytestmark = pytest.mark.anyio

S = RoutineStatus
HOUR = 3_600_000


def hourly(rid: str) -> ScheduleCreate:
    return ScheduleCreate(id=rid, spec="0 * * * *", target=WorkTemplate(binding="echo"))


def once_at(rid: str, instant_ms: int) -> ScheduleCreate:
    iso = datetime.fromtimestamp(instant_ms / 1000, UTC).isoformat()
    return ScheduleCreate(id=rid, spec=f"once@{iso}", target=WorkTemplate(binding="echo"))


async def works_of(store: Store, routine_id: str) -> list[Work]:
    return [w for w in await store.list_work() if w.scheduled_by == f"routine:{routine_id}"]


async def status_is(store: Store, routine_id: str, status: RoutineStatus) -> bool:
    return (await store.get_routine(routine_id)).status is status


class TimedTarget(StoreTarget):
    """Notes the wall-clock instant each fire's Work creation was asked for."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.asked_at: dict[str, int] = {}

    async def _submit_many(self, items: list[tuple[Work, Event | None]]) -> list[Any]:
        now = SystemClock().now_ms()
        self.asked_at.update((work.id, now) for work, _ in items)
        return await super()._submit_many(items)


async def test_a_fire_claimed_ahead_happens_at_its_instant_never_before(store: Store) -> None:
    """Real clock: two groups of one-shots a second apart, claimed 800 ms ahead; every Work is
    asked for and stamped at or after its scheduled instant, and the claims did run ahead.

    Each Routine is claimed once: a fire started early would be refused by the misfire rule
    (not due yet: skipped, re-armed at the same instant) and the row claimed again."""
    clock = SystemClock()
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"})
    first = (clock.now_ms() // 1000 + 2) * 1000
    instants = {f"r{i}": first + 1000 * (i % 2) for i in range(6)}
    for rid, instant in instants.items():
        await source.create(once_at(rid, instant))
    claimed_at: dict[str, tuple[int, int]] = {}  # routine -> (claim returned, its instant)
    claims: list[str] = []
    claim_queued = store.claim_queued

    async def timed_claim(*args: Any, **kwargs: Any) -> list[Routine]:
        won = await claim_queued(*args, **kwargs)
        now = clock.now_ms()
        claims.extend(r.id for r in won)
        claimed_at.update((r.id, (now, r.next_run_at_ms or 0)) for r in won)
        return won

    store.claim_queued = timed_claim  # type: ignore[method-assign]
    target = TimedTarget(store)
    ticker = Ticker(store, target, clock, owner="t", claim_ahead_ms=800)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        with anyio.fail_after(20):
            while len(target.asked_at) < len(instants):  # noqa: ASYNC110 - fires, with a deadline
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert sorted(claims) == sorted(instants), claims
    assert any(returned < instant for returned, instant in claimed_at.values()), claimed_at
    for work in await store.list_work():
        rid = work.scheduled_by.removeprefix("routine:")
        scheduled = instants[rid]
        assert work.id == f"routine:{rid}:{scheduled}"
        assert target.asked_at[work.id] >= scheduled, (rid, target.asked_at[work.id] - scheduled)
        assert work.created_at_ms >= scheduled, (rid, work.created_at_ms - scheduled)


async def test_after_a_claim_ahead_pause_and_edit_are_refused_and_a_deletion_never_fires(
    store: Store, clock: ManualClock
) -> None:
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"})
    for rid in ("kept", "deleted"):
        await source.create(hourly(rid))
    clock.set(T0 + HOUR - 300)
    ticker = Ticker(store, StoreTarget(store), clock, owner="t")  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.tick)  # claims both ahead, then waits for the clock to read 11:00
        await eventually(lambda: status_is(store, "kept", S.CLAIMED))
        await eventually(lambda: status_is(store, "deleted", S.CLAIMED))
        # A claimed row is busy: its schedule cannot change under the fire.
        for change in (
            ScheduleChange(action="pause"),
            ScheduleChange(action="edit", spec="5 * * * *"),
        ):
            with pytest.raises(ConduitError) as caught:
                await source.change("kept", change)
            assert caught.value.code == "routine_busy"
        await source.delete("deleted")
        assert await store.list_work() == []  # nothing fires before its instant
        clock.set(T0 + HOUR)
    (work,) = await works_of(store, "kept")
    assert (work.id, work.created_at_ms) == (f"routine:kept:{T0 + HOUR}", T0 + HOUR)
    assert await works_of(store, "deleted") == []
    assert (await store.get_routine("kept")).status is S.RUNNING


async def test_a_ticker_stopped_before_the_instant_gives_its_claims_back(
    store: Store, clock: ManualClock
) -> None:
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"})
    await source.create(hourly("hourly"))
    clock.set(T0 + HOUR - 300)
    stopped = Ticker(store, StoreTarget(store), clock, owner="stopped")  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(stopped.run)
        await eventually(lambda: status_is(store, "hourly", S.CLAIMED))
        tg.cancel_scope.cancel()
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.claim_owner, routine.next_run_at_ms) == (
        S.QUEUED, None, T0 + HOUR,
    )  # fmt: skip
    assert await store.list_work() == []
    # The next ticker takes it at once (no lease to wait for) and fires it once, at 11:00.
    heir = Ticker(store, StoreTarget(store), clock, owner="heir")  # type: ignore[arg-type]
    clock.set(T0 + HOUR)
    await heir.tick()
    (work,) = await store.list_work()
    assert (work.id, work.created_at_ms) == (f"routine:hourly:{T0 + HOUR}", T0 + HOUR)
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.claim_owner) == (S.RUNNING, "heir")
