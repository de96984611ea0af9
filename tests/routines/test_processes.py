"""Tickers in real processes on one store (SQLite file or PostgreSQL)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from conduit_core.model import RoutineStatus, WorkTemplate
from conduit_core.routines import ScheduleChange, ScheduleCreate, Ticker
from conduit_core.routines.managed import ConduitRoutineSource
from conduit_core.runtime import SystemClock
from conduit_core.storage import Store
from tests.routines.conftest import StoreTarget, eventually

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.routines._ticker_proc", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def test_two_ticker_processes_fire_each_due_row_exactly_once(
    store: Store, store_url: str
) -> None:
    clock = SystemClock()
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"})
    for i in range(12):  # every second, seconds-first 6-field cron
        await source.create(
            ScheduleCreate(id=f"r{i:02d}", spec="* * * * * *", target=WorkTemplate(binding="echo"))
        )
    procs = [spawn("race", store_url, owner, "4") for owner in ("p1", "p2")]
    outputs = await anyio.to_thread.run_sync(lambda: [p.communicate(timeout=60) for p in procs])
    fires: list[dict[str, object]] = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        fires += [line for line in map(json.loads, out.splitlines()) if "work_id" in line]
    per_fire = Counter(str(f["work_id"]) for f in fires)
    # Every (routine, scheduled_for) was claimed and fired by one process, once.
    assert per_fire
    assert max(per_fire.values()) == 1, per_fire.most_common(3)
    assert all(f["created"] for f in fires)
    by_owner = Counter(str(f["owner"]) for f in fires)
    routines_fired = {str(f["work_id"]).split(":")[1] for f in fires}
    # Every Routine fired (how often in 4 s depends on how loaded the machine is: not asserted).
    assert len(routines_fired) == 12
    assert sum(by_owner.values()) >= 12
    # (A fire cut off by the end of its process may have created its Work without printing.)
    stored = {w.id for w in await store.list_work(limit=10_000)}
    assert set(per_fire) <= stored


async def test_a_fire_killed_after_creating_its_work_is_retried_without_a_second_work(
    store: Store, store_url: str
) -> None:
    clock = SystemClock()
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"})
    await source.create(
        ScheduleCreate(id="yearly", spec="0 0 1 1 *", target=WorkTemplate(binding="echo"))
    )
    await source.change("yearly", ScheduleChange(action="run"))
    proc = spawn("die", store_url, "doomed")
    _, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
    assert proc.returncode == -9, err
    (work,) = await store.list_work()
    routine = await store.get_routine("yearly")
    assert (routine.status, routine.claim_owner) == (RoutineStatus.CLAIMED, "doomed")
    # A new daemon boots once the dead claim's lease (300 ms) has expired.
    heir = Ticker(store, StoreTarget(store), clock, owner="heir")

    async def healed() -> bool:
        return bool(await heir.boot_resume())

    await eventually(healed, within=10)
    await heir.tick()
    assert [w.id for w in await store.list_work()] == [work.id]
    routine = await store.get_routine("yearly")
    assert (routine.status, routine.claim_owner, routine.fired_work_id) == (
        RoutineStatus.RUNNING, "heir", work.id,
    )  # fmt: skip


async def test_a_ticker_killed_after_claiming_ahead_fires_once_through_its_heir(
    store: Store, store_url: str
) -> None:
    clock = SystemClock()
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"})
    # Far enough ahead that the racer (claiming 10 s ahead) claims before the instant even when
    # its start-up is slow; the claim is checked to have come first.
    instant = (clock.now_ms() // 1000 + 5) * 1000
    iso = datetime.fromtimestamp(instant / 1000, UTC).isoformat()
    await source.create(
        ScheduleCreate(id="once", spec=f"once@{iso}", target=WorkTemplate(binding="echo"))
    )
    proc = spawn("die-ahead", store_url, "doomed")
    _, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
    assert proc.returncode == -9, err
    routine = await store.get_routine("once")
    assert (routine.status, routine.claim_owner) == (RoutineStatus.CLAIMED, "doomed")
    assert routine.updated_at_ms < instant  # claimed ahead of the instant
    assert await store.list_work() == []
    # Another daemon heals the dead claim once its lease (300 ms) expired, and fires it once.
    heir = Ticker(store, StoreTarget(store), clock, owner="heir")

    async def fired() -> bool:
        return (await store.get_routine("once")).status is RoutineStatus.RUNNING

    async with anyio.create_task_group() as tg:
        await eventually(lambda: _healed(heir), within=10)
        await tg.start(heir.run)
        await eventually(fired, within=15)
        tg.cancel_scope.cancel()
    (work,) = await store.list_work()
    assert work.id == f"routine:once:{instant}"
    assert work.created_at_ms >= instant
    routine = await store.get_routine("once")
    assert (routine.claim_owner, routine.fired_work_id) == ("heir", work.id)
    assert [run.scheduled_for_ms for run in await store.routine_history("once")] == [instant]


async def _healed(ticker: Ticker) -> bool:
    return bool(await ticker.boot_resume())
