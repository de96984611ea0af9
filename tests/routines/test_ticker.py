"""The ledger in the store and the ticker over it, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import msgspec
import pytest

from conduit_core.errors import ConduitError
from conduit_core.model import (
    Event,
    MisfirePolicy,
    Routine,
    RoutineStatus,
    Work,
    WorkStatus,
    WorkTemplate,
)
from conduit_core.routines import ScheduleChange, ScheduleCreate
from conduit_core.routines.managed import ConduitRoutineSource
from conduit_core.routines.ticker import Ticker
from conduit_core.runtime import ManualClock
from conduit_core.storage import SqlStore, Store
from tests.routines.conftest import T0, StoreTarget, eventually, finish_work, ms

pytestmark = pytest.mark.anyio

S = RoutineStatus
MINUTE = 60_000
HOUR = 60 * MINUTE


def create(spec: str = "0 * * * *", rid: str = "hourly", **fields: object) -> ScheduleCreate:
    target = fields.pop("target", WorkTemplate(binding="echo", input={"n": 1}))
    return ScheduleCreate(spec=spec, id=rid, target=target, **fields)  # type: ignore[arg-type]


def ticker(store: Store, clock: ManualClock, owner: str = "daemon-a", **kw: object) -> Ticker:
    return Ticker(store, StoreTarget(store), clock, owner=owner, **kw)  # type: ignore[arg-type]


async def works_of(store: Store, routine_id: str) -> list[Work]:
    return [
        w for w in await store.list_work(limit=1000) if w.scheduled_by == f"routine:{routine_id}"
    ]


async def status_is(store: Store, routine_id: str, status: RoutineStatus) -> bool:
    return (await store.get_routine(routine_id)).status is status


# --- Registration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (create(""), "invalid_cron_spec"),
        (create("* * *"), "invalid_cron_spec"),
        (create("61 * * * *"), "invalid_cron_spec"),
        (create("once@2026-03-02T12:00:00"), "invalid_cron_spec"),  # no offset
        (create("once@2026-03-01T12:00:00Z"), "invalid_cron_spec"),  # in the past
        (create(timezone="Mars/Olympus"), "invalid_timezone"),
        (create(target=WorkTemplate(binding="nope")), "unknown_binding"),
        (create(target=WorkTemplate(binding="echo", scope="nowhere")), "unknown_scope"),
        (create(rid="bad:id"), "invalid_routine_id"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_stored(
    source: ConduitRoutineSource, store: Store, request_: ScheduleCreate, code: str
) -> None:
    with pytest.raises(ConduitError) as caught:
        await source.create(request_)
    assert caught.value.code == code
    assert await store.list_routines() == []


async def test_created_routine_is_armed_at_its_next_occurrence(
    source: ConduitRoutineSource, store: Store
) -> None:
    record = await source.create(create("*/15 * * * *", timezone="Europe/Berlin"))
    assert record.id == "conduit:hourly"
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.next_run_at_ms) == (S.IDLE, T0 + 15 * MINUTE)
    assert (routine.scope, routine.target.scope) == ("root", "root")
    with pytest.raises(ConduitError) as caught:
        await source.create(create("*/15 * * * *"))
    assert caught.value.code == "routine_exists"
    assert await store.next_due_at() == T0 + 15 * MINUTE


# --- The fire cycle -----------------------------------------------------------------------------


async def test_fire_creates_work_and_success_re_arms_on_the_scheduled_time(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create())
    tick = ticker(store, clock)
    assert await tick.tick() == 60_000  # nothing due for an hour: the 60 s rescan
    clock.set(T0 + HOUR + 20)
    await tick.tick()
    (work,) = await works_of(store, "hourly")
    assert work.id == f"routine:hourly:{T0 + HOUR}"
    assert (work.binding, work.scope, work.kind) == ("echo", "root", "task")
    (first,) = await store.pending_inputs(work.id)
    assert (first.type, first.payload) == ("core.routine.fire", {"n": 1})
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.fired_work_id, routine.scheduled_for_ms) == (
        S.RUNNING, work.id, T0 + HOUR,
    )  # fmt: skip
    # One pending run per Routine: still running while the Work runs, even past the next hour.
    clock.set(T0 + 2 * HOUR + 5 * MINUTE)
    await tick.tick()
    assert len(await works_of(store, "hourly")) == 1
    await finish_work(store, work.id, WorkStatus.COMPLETED, clock.now_ms())
    await tick.tick()
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.next_run_at_ms) == (S.IDLE, T0 + 2 * HOUR)
    (run,) = await store.routine_history("hourly")
    assert (run.scheduled_for_ms, run.work_id, run.outcome) == (T0 + HOUR, work.id, "completed")
    kinds = [e.type for e in await _routine_events(store)]
    for kind in ("fired", "dispatched", "completed"):
        assert f"core.routine.{kind}" in kinds


async def _routine_events(store: Store) -> list[Event]:
    """The stored ``core.routine.*`` events (read through the store's private reader)."""
    rows = await store._read(  # type: ignore[attr-defined]
        lambda cx: cx.rows("SELECT id FROM conduit_event WHERE id LIKE ?", ("routine-event/%",))
    )
    return [await store.get_event(event_id) for (event_id,) in rows]


async def test_failure_halts_a_recurring_routine_until_resumed(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create())
    tick = ticker(store, clock)
    clock.set(T0 + HOUR)
    await tick.tick()
    (work,) = await works_of(store, "hourly")
    await finish_work(store, work.id, WorkStatus.FAILED, clock.now_ms())
    await tick.tick()
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.next_run_at_ms) == (S.ERROR, None)
    assert "failed" in (routine.last_error or "")
    # Error-halts: hours later nothing has fired again.
    for hours in range(2, 6):
        clock.set(T0 + hours * HOUR)
        await tick.tick()
    assert len(await works_of(store, "hourly")) == 1
    assert (await store.get_routine("hourly")).status is S.ERROR
    record = await source.change("hourly", ScheduleChange(action="resume"))
    assert (record.status, record.next_run_at_ms) == ("idle", T0 + 6 * HOUR)
    clock.set(T0 + 6 * HOUR)
    await tick.tick()
    assert len(await works_of(store, "hourly")) == 2


async def test_pause_never_fires_and_is_refused_while_a_fire_runs(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create("* * * * *", rid="minutely"))
    await source.create(create())
    tick = ticker(store, clock)
    await source.change("minutely", ScheduleChange(action="pause"))
    for minutes in range(1, 120, 7):
        clock.set(T0 + minutes * MINUTE)
        await tick.tick()
    assert await works_of(store, "minutely") == []
    assert (await store.get_routine("minutely")).status is S.PAUSED
    # hourly fired at 11:00 and is running: pause and resume are refused, nothing changes.
    assert (await store.get_routine("hourly")).status is S.RUNNING
    for action in ("pause", "resume", "run"):
        with pytest.raises(ConduitError) as caught:
            await source.change("hourly", ScheduleChange(action=action))  # type: ignore[arg-type]
        assert caught.value.code in ("routine_busy", "illegal_transition")
    assert (await store.get_routine("hourly")).status is S.RUNNING


async def test_one_shot_fires_once_then_goes_quiet(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create("once@2026-03-02T11:30:00+01:00", rid="once"))  # 10:30 UTC
    tick = ticker(store, clock)
    clock.set(T0 + 30 * MINUTE)
    await tick.tick()
    (work,) = await works_of(store, "once")
    await finish_work(store, work.id, WorkStatus.COMPLETED, clock.now_ms())
    await tick.tick()
    routine = await store.get_routine("once")
    assert (routine.status, routine.next_run_at_ms) == (S.IDLE, None)
    clock.set(T0 + 48 * HOUR)
    await tick.tick()
    assert len(await works_of(store, "once")) == 1


@pytest.mark.parametrize(
    ("policy", "fired_for", "next_after"),
    [
        # Down 10:00 -> 15:20: coalesce fires once for 15:00 (the latest), re-arms at 16:00.
        (MisfirePolicy.COALESCE, T0 + 5 * HOUR, T0 + 6 * HOUR),
        # skip: 15:00 is 20 minutes late, beyond the 60 s grace: nothing fires.
        (MisfirePolicy.SKIP, None, T0 + 6 * HOUR),
    ],
)
async def test_misfire_after_a_simulated_downtime(
    source: ConduitRoutineSource,
    store: Store,
    clock: ManualClock,
    policy: MisfirePolicy,
    fired_for: int | None,
    next_after: int,
) -> None:
    await source.create(create(misfire=policy))
    clock.set(T0 + 5 * HOUR + 20 * MINUTE)  # the daemon was down since 10:00
    tick = ticker(store, clock)
    await tick.boot_resume()
    await tick.tick()
    works = await works_of(store, "hourly")
    if fired_for is None:
        assert works == []
        routine = await store.get_routine("hourly")
        assert (routine.status, routine.next_run_at_ms) == (S.IDLE, next_after)
        return
    assert [w.id for w in works] == [f"routine:hourly:{fired_for}"]
    await finish_work(store, works[0].id, WorkStatus.COMPLETED, clock.now_ms())
    await tick.tick()
    assert (await store.get_routine("hourly")).next_run_at_ms == next_after


async def test_skip_within_grace_still_fires(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create(misfire=MisfirePolicy.SKIP, grace_seconds=120))
    clock.set(T0 + HOUR + 90_000)
    await ticker(store, clock).tick()
    assert [w.id for w in await works_of(store, "hourly")] == [f"routine:hourly:{T0 + HOUR}"]


# --- Idempotent fires, claims and boot-resume ---------------------------------------------------


async def test_a_retried_fire_never_creates_a_second_work(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    """A fire that created its Work and died before recording it is fired again after its
    claim expires: it finds its Work by the fire key."""
    await source.create(create())
    clock.set(T0 + HOUR)
    dead = ticker(store, clock, owner="dead", lease_ms=30_000)
    await store.due_pass(now_ms=clock.now_ms())
    (claimed,) = await store.claim_queued(dead._claim_change(clock.now_ms()), limit=10)
    # The dead ticker created the Work, then was killed before start_fire.
    await StoreTarget(store).submit(
        Work(id=f"routine:hourly:{T0 + HOUR}", scope="root", binding="echo",
             scheduled_by="routine:hourly", created_at_ms=T0, updated_at_ms=T0),
    )  # fmt: skip
    clock.advance(31_000)
    alive = ticker(store, clock, owner="alive")
    healed = await alive.boot_resume()
    assert [(r.id, r.status) for r in healed] == [("hourly", S.QUEUED)]
    await alive.tick()
    assert [w.id for w in await works_of(store, "hourly")] == [f"routine:hourly:{T0 + HOUR}"]
    routine = await store.get_routine("hourly")
    assert (routine.status, routine.claim_owner) == (S.RUNNING, "alive")
    assert claimed.claim_token != routine.claim_token


async def test_boot_resume_leaves_a_live_daemons_fire_alone(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create())
    await source.create(create("once@2026-03-02T11:00:00Z", rid="once"))
    clock.set(T0 + HOUR)
    live = ticker(store, clock, owner="live", lease_ms=5 * MINUTE)
    await live.tick()
    assert {r.id: r.status for r in await store.running_routines()} == {
        "hourly": S.RUNNING, "once": S.RUNNING,
    }  # fmt: skip
    # A second daemon boots while the first one's claims are live: nothing is healed.
    clock.advance(MINUTE)
    booted = ticker(store, clock, owner="booted")
    assert await booted.boot_resume() == []
    await booted.tick()
    for routine in await store.running_routines():
        assert (routine.status, routine.claim_owner) == (S.RUNNING, "live")
    # The live daemon renews its claims every tick, so they stay live past the first lease.
    clock.advance(4 * MINUTE)
    await live.tick()
    clock.advance(4 * MINUTE)
    assert await booted.boot_resume() == []
    # The live daemon dies; after its lease expires the next boot heals: recurring -> idle at
    # the next occurrence, one-shot -> error (its outcome is unknown).
    clock.advance(6 * MINUTE)
    healed = {r.id: r for r in await booted.boot_resume()}
    assert (healed["hourly"].status, healed["hourly"].next_run_at_ms) == (S.IDLE, T0 + 2 * HOUR)
    assert healed["once"].status is S.ERROR


def _meet_after(store: Store, method: str, *, parties: int) -> None:
    """The first ``parties`` calls of ``store.<method>`` return together (a barrier)."""
    original = getattr(store, method)
    arrived = {"n": 0}
    everyone = anyio.Event()

    async def met(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        if arrived["n"] < parties:
            arrived["n"] += 1
            if arrived["n"] == parties:
                everyone.set()
            with anyio.fail_after(30):
                await everyone.wait()
        return result

    setattr(store, method, met)


async def _race_two_tickers(
    source: ConduitRoutineSource, store: Store, clock: ManualClock, batch: bool
) -> tuple[dict[str, list[str]], list[str], list[Work]]:
    """Twenty due Routines, two tickers ticking at once. Returns what each ticker's target was
    asked to submit (every fire it dispatched), the ``core.routine.fired`` events stored, and
    the Work rows. ``batch``: the targets submit each claim pass's fires at once."""
    for i in range(20):
        await source.create(create("*/5 * * * *", rid=f"r{i:02d}"))
    targets = {owner: StoreTarget(store, batch=batch) for owner in ("a", "b")}
    tickers = [
        Ticker(store, target, clock, owner=owner)  # type: ignore[arg-type]
        for owner, target in targets.items()
    ]
    # The race, made certain rather than left to the machine's timing: both tickers find the
    # rows due before either claims, and both claims return before either fires.
    _meet_after(store, "next_due_at", parties=2)
    _meet_after(store, "claim_queued", parties=2)
    clock.set(T0 + 5 * MINUTE)
    async with anyio.create_task_group() as tg:
        for t in tickers:
            tg.start_soon(t.tick)
    assert isinstance(store, SqlStore)
    fired = await anyio.to_thread.run_sync(
        lambda: store.transaction(
            lambda cx: [
                str(r[0])
                for r in cx.rows(
                    "SELECT id FROM conduit_event WHERE id LIKE ?", ("routine-event/%/fired",)
                )
            ],
            write=False,
        )
    )
    submitted = {owner: list(t.submitted) for owner, t in targets.items()}
    return submitted, fired, await store.list_work(limit=1000)


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "one-by-one"])
async def test_two_tickers_race_and_each_due_row_fires_once(
    source: ConduitRoutineSource, store: Store, clock: ManualClock, batch: bool
) -> None:
    """Each due row fires once, counted where a double fire would show: in the fires each
    ticker made and in the stored fire events. (Work rows cannot show it: a fire's Work id is
    deterministic, so a second fire of the same occurrence finds its Work and is swallowed as
    ``work_exists``.) The negative control below shows this detector catching double fires."""
    submitted, fired, works = await _race_two_tickers(source, store, clock, batch)
    expected = sorted(f"routine:r{i:02d}:{T0 + 5 * MINUTE}" for i in range(20))
    both = Counter(submitted["a"] + submitted["b"])
    assert sorted(both) == expected
    assert max(both.values()) == 1, both.most_common(3)
    assert len(fired) == 20
    assert sorted(w.id for w in works) == expected
    owners = {r.claim_owner for r in await store.running_routines()}
    assert owners <= {"a", "b"}


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "one-by-one"])
async def test_negative_control_double_fires_are_seen_without_claim_fencing(
    source: ConduitRoutineSource,
    store: Store,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    batch: bool,
) -> None:
    """Switch the claim fencing off (test-only, by monkeypatch; restored after the test): a
    claim may take a row another ticker already claimed. The detector above sees the double
    fires; the Work rows alone do not."""
    from conduit_core.routines import ledger
    from conduit_core.storage import _ops_routines

    unfenced_claim = ledger.claim

    def claim_anyway(routine: Routine, **kw: Any) -> Routine:
        if routine.status is S.CLAIMED:  # another ticker's claim, taken over without a fence
            routine = msgspec.structs.replace(routine, status=S.QUEUED)
        return unfenced_claim(routine, **kw)

    monkeypatch.setattr(ledger, "claim", claim_anyway)
    monkeypatch.setattr(
        _ops_routines,
        "_CANDIDATES_QUEUED",
        _ops_routines._CANDIDATES_QUEUED.replace(
            "status = 'queued'", "status IN ('queued', 'claimed')"
        ),
    )
    fenced_sql = _ops_routines._claim_sql
    monkeypatch.setattr(
        _ops_routines,
        "_claim_sql",
        lambda count: fenced_sql(count).replace(" AND conduit_routine.status = v.column2", ""),
    )
    submitted, fired, works = await _race_two_tickers(source, store, clock, batch)
    both = Counter(submitted["a"] + submitted["b"])
    assert max(both.values()) == 2  # the detector sees occurrences fired twice
    # Blind to it: the Work rows the old check counted, and the stored fire events (the loser's
    # outcome write is refused by its stale claim token, so only one event per occurrence).
    assert len(works) == 20
    assert len(fired) == 20


# --- Bound Routines and the one-firing-owner invariant ------------------------------------------


async def _manual_work(store: Store, work_id: str, scheduled_by: str = "manual") -> Work:
    return await store.create_work(
        Work(id=work_id, scope="root", binding="echo", scheduled_by=scheduled_by,
             created_at_ms=T0, updated_at_ms=T0)
    )  # fmt: skip


async def test_binding_an_existing_work_enforces_one_firing_owner(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await _manual_work(store, "w-manual")
    await _manual_work(store, "w-owned", scheduled_by="routine:someone-else")
    once = "once@2026-03-02T12:00:00Z"
    with pytest.raises(ConduitError) as caught:
        await source.create(create(once, rid="b1", target=WorkTemplate(work_id="w-owned")))
    assert (caught.value.code, getattr(caught.value, "http_status", None)) == (
        "duplicate_firing_owner", 409,
    )  # fmt: skip
    with pytest.raises(ConduitError) as caught:
        await source.create(create("0 * * * *", rid="b2", target=WorkTemplate(work_id="w-manual")))
    assert (caught.value.code, getattr(caught.value, "http_status", None)) == (
        "bound_recurring_schedule", 400,
    )  # fmt: skip
    with pytest.raises(ConduitError) as caught:
        await source.create(create(once, rid="b3", target=WorkTemplate(work_id="w-missing")))
    assert caught.value.code == "not_found"
    assert await store.list_routines() == []
    assert (await store.get_work("w-manual")).scheduled_by == "manual"
    # A manual Work is stamped with its new owner in the same transaction.
    await source.create(create(once, rid="b4", target=WorkTemplate(work_id="w-manual")))
    assert (await store.get_work("w-manual")).scheduled_by == "routine:b4"
    with pytest.raises(ConduitError) as caught:
        await source.create(create(once, rid="b5", target=WorkTemplate(work_id="w-manual")))
    assert caught.value.code == "duplicate_firing_owner"


async def test_a_bound_fire_delivers_input_and_a_finished_work_counts_as_satisfied(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await _manual_work(store, "w-bound")
    await source.create(
        create("once@2026-03-02T12:00:00Z", rid="bound", target=WorkTemplate(work_id="w-bound"))
    )
    clock.set(T0 + 2 * HOUR)
    tick = ticker(store, clock)
    await tick.tick()
    (delivered,) = await store.pending_inputs("w-bound")
    assert delivered.delivery_id == f"routine:bound:{T0 + 2 * HOUR}/input"
    assert (await store.get_routine("bound")).status is S.RUNNING
    await finish_work(store, "w-bound", WorkStatus.CANCELLED, clock.now_ms())
    await tick.tick()
    routine = await store.get_routine("bound")
    assert (routine.status, routine.next_run_at_ms, routine.last_error) == (S.IDLE, None, None)


# --- The timer ----------------------------------------------------------------------------------


async def test_the_timer_is_clamped_to_the_rescan(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    tick = ticker(store, clock)
    assert await tick.tick() == 60_000  # nothing armed: the 60 s rescan
    await source.create(create("30 10 * * *", rid="daily"))
    assert await tick.tick() == 60_000  # 30 minutes away: still the rescan
    clock.set(T0 + 30 * MINUTE - 1_500)
    assert await tick.tick() == 1_500 - tick.claim_ahead_ms  # it wakes to claim ahead


async def test_run_now_re_arms_the_sleeping_ticker_at_once(
    store: Store, clock: ManualClock
) -> None:
    tick = ticker(store, clock, max_sleep_ms=60_000)
    source = ConduitRoutineSource(store, clock, bindings={"echo": "root"}, on_change=tick.poke)
    await source.create(create("0 0 1 1 *", rid="yearly"))
    async with anyio.create_task_group() as tg:
        await tg.start(tick.run)
        with anyio.fail_after(5):
            while tick.armed_ms != 60_000:  # noqa: ASYNC110 - the armed timer, polled
                await anyio.sleep(0.01)
        await source.change("yearly", ScheduleChange(action="run"))
        # Far less than the 60 s the timer was armed for. The fire writes its Work, then marks
        # the Routine running in a second write: wait for both before stopping the ticker.
        await eventually(lambda: works_of(store, "yearly"), within=5)
        await eventually(lambda: status_is(store, "yearly", S.RUNNING), within=5)
        tg.cancel_scope.cancel()
    assert (await store.get_routine("yearly")).status is S.RUNNING


async def test_a_slow_fire_never_delays_another_routine(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create("*/5 * * * *", rid="slow"))
    await source.create(create("*/5 * * * *", rid="quick"))
    target = StoreTarget(store, batch=False)  # fires that create Work one by one, as they may
    gate = anyio.Event()
    target.block["routine:slow:"] = gate
    tick = Ticker(store, target, clock, owner="a")
    clock.set(T0 + 5 * MINUTE)
    async with anyio.create_task_group() as tg:
        await tg.start(tick.run)
        await eventually(lambda: status_is(store, "quick", S.RUNNING), within=5)
        assert (await store.get_routine("slow")).status is S.CLAIMED
        assert await works_of(store, "slow") == []
        gate.set()
        await eventually(lambda: status_is(store, "slow", S.RUNNING), within=5)
        tg.cancel_scope.cancel()


async def test_delete_and_edit(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    await source.create(create())
    record = await source.change("hourly", ScheduleChange(action="edit", spec="30 * * * *"))
    assert (record.spec, record.next_run_at_ms) == ("30 * * * *", T0 + 30 * MINUTE)
    with pytest.raises(ConduitError) as caught:
        await source.change("hourly", ScheduleChange(action="edit", spec="99 * * * *"))
    assert caught.value.code == "invalid_cron_spec"
    await source.delete("hourly")
    with pytest.raises(ConduitError) as caught:
        await source.delete("hourly")
    assert caught.value.code == "not_found"
    assert ms("2026-03-02T10:00:00Z") == T0


async def test_a_stored_spec_this_version_no_longer_reads_halts_the_routine(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    """A row stored by an older conduit (croniter read ``L``; once@ had no bound) neither
    crashes the ticker nor fires: its fire halts it in ``error`` saying why; a running one is
    healed to ``error`` at boot. Before, the parse error escaped the fire (and boot-resume)."""
    await source.create(create(rid="old-l"))
    await source.create(create("*/5 * * * *", rid="old-running"))
    await source.create(create("*/5 * * * *", rid="fine"))
    await store.apply_routine(
        "old-l", lambda r: msgspec.structs.replace(r, cron_spec="0 0 L * *", next_run_at_ms=T0)
    )
    tick = ticker(store, clock)
    clock.set(T0 + 5 * MINUTE)
    await tick.tick()
    halted = await store.get_routine("old-l")
    assert (halted.status, halted.next_run_at_ms) == (S.ERROR, None)
    assert halted.last_error is not None
    assert "stored spec cannot be read" in halted.last_error
    assert "invalid_cron_spec" in halted.last_error
    assert await works_of(store, "old-l") == []
    assert (await store.get_routine("fine")).status is S.RUNNING  # the others fired
    # A running fire whose spec became unreadable, left by a dead ticker: healed, not crashed.
    running = await store.get_routine("old-running")
    assert running.status is S.RUNNING
    await store.apply_routine(
        "old-running",
        lambda r: msgspec.structs.replace(
            r, cron_spec="once@9999-12-31T23:59:59-23:59", claim_expires_at_ms=T0
        ),
    )
    healed = {r.id: r for r in await ticker(store, clock, owner="heir").boot_resume()}
    assert healed["old-running"].status is S.ERROR
    assert "cannot be read" in (healed["old-running"].last_error or "")


# --- Metrics: fire lateness and misfires ---------------------------------------------------------


def _metric(name: str, **labels: str) -> float:
    from conduit_core.telemetry import METRICS

    return METRICS.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("policy", "missed", "late_s"),
    [
        # Down 10:00 -> 15:20: 11:00 to 14:00 fold into the 15:00 fire, 20 minutes late.
        (MisfirePolicy.COALESCE, 4, 20 * 60),
        # skip: 11:00 to 15:00 never fire (15:00 is past the 60 s grace); nothing is late.
        (MisfirePolicy.SKIP, 5, None),
    ],
)
async def test_misfires_and_fire_lateness_are_counted(
    source: ConduitRoutineSource,
    store: Store,
    clock: ManualClock,
    policy: MisfirePolicy,
    missed: int,
    late_s: int | None,
) -> None:
    labels = {"routine": "hourly", "policy": str(policy)}
    misfires = _metric("conduit_routine_misfires_total", **labels)
    fires = _metric("conduit_routine_fire_lateness_seconds_count")
    lateness = _metric("conduit_routine_fire_lateness_seconds_sum")
    await source.create(create(misfire=policy))
    clock.set(T0 + 5 * HOUR + 20 * MINUTE)
    tick = ticker(store, clock)
    await tick.boot_resume()
    await tick.tick()
    assert _metric("conduit_routine_misfires_total", **labels) - misfires == missed
    fired = _metric("conduit_routine_fire_lateness_seconds_count") - fires
    assert fired == (0 if late_s is None else 1)
    if late_s is not None:
        # The histogram is process-wide: earlier tests in this worker left a fractional sum,
        # so the difference is only as exact as float subtraction (it read 1199.9999999999995).
        assert _metric("conduit_routine_fire_lateness_seconds_sum") - lateness == pytest.approx(
            late_s
        )
        # Stored twin: the fire the ledger recorded is that late.
        (work,) = await works_of(store, "hourly")
        assert work.id == f"routine:hourly:{T0 + 5 * HOUR}"


# --- Batched fires and settles ------------------------------------------------------------------


async def _fire_records(store: Store, routine_id: str) -> tuple[Any, ...]:
    """What a fire left: its Routine row, Work, first input and run, ids made comparable."""
    routine = await store.get_routine(routine_id)
    (work,) = await works_of(store, routine_id)
    (first,) = await store.pending_inputs(work.id)
    (run,) = await store.routine_history(routine_id)
    kinds = sorted(e.type for e in await _routine_events(store) if f"/{routine_id}/" in e.id)
    return (
        (routine.status, routine.fired_work_id, routine.scheduled_for_ms, routine.claim_owner),
        (work.id, work.scope, work.binding, work.pending_inputs, work.scheduled_by),
        (first.id, first.type, first.payload),
        (run.work_id, run.outcome, run.scheduled_for_ms),
        kinds,
    )


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "one-by-one"])
async def test_a_claim_pass_fires_in_one_batch_with_the_same_records(
    source: ConduitRoutineSource, store: Store, clock: ManualClock, batch: bool
) -> None:
    """A claim pass creates all its fires' Work in one submit (bound Routines still deliver
    their input one by one) and records each fire exactly as a one-by-one fire does."""
    for i in range(5):
        await source.create(create("*/5 * * * *", rid=f"r{i}"))
    await _manual_work(store, "w-bound")
    await source.create(
        create("once@2026-03-02T10:05:00Z", rid="bound", target=WorkTemplate(work_id="w-bound"))
    )
    target = StoreTarget(store, batch=batch)
    clock.set(T0 + 5 * MINUTE + 10)
    await Ticker(store, target, clock, owner="a").tick()  # type: ignore[arg-type]
    assert target.batches == ([5] if batch else [])
    assert sorted(target.submitted) == [f"routine:r{i}:{T0 + 5 * MINUTE}" for i in range(5)]
    records = await _fire_records(store, "r3")
    assert records == (
        (S.RUNNING, f"routine:r3:{T0 + 5 * MINUTE}", T0 + 5 * MINUTE, "a"),
        (f"routine:r3:{T0 + 5 * MINUTE}", "root", "echo", 1, "routine:r3"),
        (f"routine:r3:{T0 + 5 * MINUTE}/input", "core.routine.fire", {"n": 1}),
        (f"routine:r3:{T0 + 5 * MINUTE}", "running", T0 + 5 * MINUTE),
        ["core.routine.dispatched", "core.routine.fired"],
    )
    bound = await store.get_routine("bound")
    assert (bound.status, bound.fired_work_id) == (S.RUNNING, "w-bound")
    assert [e.type for e in await store.pending_inputs("w-bound")] == ["core.routine.fire"]


async def test_a_batched_fire_of_an_existing_work_is_recorded_once(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    """A retried fire in a batch finds the Work its key names and records the fire (the one
    Work, no second input); a fire whose Work cannot be created halts its Routine."""
    await source.create(create("*/5 * * * *", rid="retried"))
    await source.create(create("*/5 * * * *", rid="unbound"))
    await StoreTarget(store).submit(
        Work(id=f"routine:retried:{T0 + 5 * MINUTE}", scope="root", binding="echo",
             scheduled_by="routine:retried", created_at_ms=T0, updated_at_ms=T0),
    )  # fmt: skip

    class Refusing(StoreTarget):
        async def _submit_many(self, items: list[tuple[Work, Event | None]]) -> list[Any]:
            results = await super()._submit_many(items)
            return [
                ConduitError("binding gone", code="unknown_binding")
                if w.id.startswith("routine:unbound:")
                else r
                for (w, _), r in zip(items, results, strict=True)
            ]

    clock.set(T0 + 5 * MINUTE)
    await Ticker(store, Refusing(store), clock, owner="a").tick()  # type: ignore[arg-type]
    retried = await store.get_routine("retried")
    assert (retried.status, retried.fired_work_id) == (
        S.RUNNING,
        f"routine:retried:{T0 + 5 * MINUTE}",
    )
    (work,) = await works_of(store, "retried")
    assert work.pending_inputs == 0  # the dead fire's Work, found by its key
    unbound = await store.get_routine("unbound")
    assert (unbound.status, unbound.next_run_at_ms) == (S.ERROR, None)
    assert "unknown_binding" in (unbound.last_error or "")


async def test_ended_fires_are_settled_without_rereading_every_running_fire(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    """Once the host reports ended fires, a tick settles those (one read of their rows); the
    other running fires are reread only every ``running_recheck_ms``."""
    for rid in ("told", "untold"):
        await source.create(create("*/5 * * * *", rid=rid))
    tick = ticker(store, clock, running_recheck_ms=60 * 60_000)
    clock.set(T0 + 5 * MINUTE)
    await tick.tick()
    for rid in ("told", "untold"):
        await finish_work(store, f"routine:{rid}:{T0 + 5 * MINUTE}", WorkStatus.COMPLETED, T0)
    tick.fire_ended("told")
    reads: list[Any] = []
    running_fires = store.running_fires

    async def counted(input_id: Any, *, ids: Any = None) -> Any:
        reads.append(ids)
        return await running_fires(input_id, ids=ids)

    store.running_fires = counted  # type: ignore[method-assign]
    await tick.tick()
    await tick.tick()  # nothing reported since: nothing read
    assert reads == [["told"]]
    assert (await store.get_routine("told")).status is S.IDLE
    assert (await store.get_routine("untold")).status is S.RUNNING  # until the next reread
    tick.running_recheck_ms = 0
    await tick.tick()
    assert reads == [["told"], None]
    assert (await store.get_routine("untold")).status is S.IDLE


async def test_a_fire_reported_ended_before_it_was_recorded_is_settled_next(
    source: ConduitRoutineSource, store: Store, clock: ManualClock
) -> None:
    """The scheduler may run a fired Work to its end before the ticker records the fire: the
    report is kept until the Routine is ``running``, then settles it."""
    await source.create(create("*/5 * * * *", rid="quick"))

    class Quick(StoreTarget):
        async def _submit_many(self, items: list[tuple[Work, Event | None]]) -> list[Any]:
            results = await super()._submit_many(items)
            for work, _ in items:
                await finish_work(store, work.id, WorkStatus.COMPLETED, T0)
                tick.fire_ended("quick")
                tick.running_recheck_ms = 60 * 60_000
                await tick.settle_running()  # the report arrives while the row is claimed
            return results

    tick = Ticker(store, Quick(store), clock, owner="a")  # type: ignore[arg-type]
    clock.set(T0 + 5 * MINUTE)
    await tick.tick()
    assert (await store.get_routine("quick")).status is S.IDLE
