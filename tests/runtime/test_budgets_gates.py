"""Budgets and start gates through the production scheduler, on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import anyio.to_thread
import msgspec
import pytest

from conduit_core.config import Budget
from conduit_core.errors import ConduitError
from conduit_core.model import Event, HoldKind, WorkKind, WorkStatus
from conduit_core.runtime import ManualClock, Scheduler, StartGateError, needs_you
from conduit_core.runtime._budgets import DAY_MS, WEEK_MS, window_start
from conduit_core.storage import Claim, NotEligibleError, SqlStore, Store
from conduit_test_plugin import plugin as test_plugin
from tests.runtime.conftest import gate_calls, input_event, submit

pytestmark = pytest.mark.anyio


async def all_events(store: Store) -> list[Event]:
    assert isinstance(store, SqlStore)
    decoder = msgspec.json.Decoder(Event)

    def read(cx: Any) -> list[Event]:
        return [decoder.decode(r[0]) for r in cx.rows("SELECT data FROM conduit_event")]

    return await anyio.to_thread.run_sync(lambda: store.transaction(read, write=False))


async def notices(store: Store, kind: str) -> list[Event]:
    return [e for e in await all_events(store) if e.type == f"core.budget.{kind}"]


async def event_types(store: Store, work_id: str) -> list[str]:
    return [e.type for e in await store.work_events(work_id) if e.type.startswith("core.")]


_turns = itertools.count(100)


async def feed(sched: Scheduler, work_id: str) -> None:
    """One more turn for standing Work, which idles without pending input."""
    if not (await sched.store.get_work(work_id)).pending_inputs:
        await sched.accept_input(input_event(work_id, next(_turns)))


async def run_one(sched: Scheduler, work_id: str) -> Claim:
    await feed(sched, work_id)
    claim = await sched.claim(work_id)
    await sched.run_attempt(claim)
    return claim


# --- Budgets --------------------------------------------------------------------------------


async def test_budget_warns_holds_with_its_reason_and_releases_one_turn(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    turns = Budget(name="two-turns", unit="turns", max=2, per="work", warn_at=0.5)
    sched = make_scheduler(budgets=(turns,))
    work = await submit(sched, kind=WorkKind.STANDING)

    await run_one(sched, work.id)  # 1 of 2: crosses warn_at
    assert [n.payload["work"] for n in await notices(store, "warning")] == [work.id]
    assert await notices(store, "exceeded") == []
    await run_one(sched, work.id)  # 2 of 2: reaches max
    (exceeded,) = await notices(store, "exceeded")
    # Named in its data, never addressed to the Work (so never its input).
    assert exceeded.work_id is None
    assert exceeded.unmatched
    assert not exceeded.pending
    assert exceeded.payload["schema"] == "core.budget.v1"
    assert exceeded.payload["work"] == work.id
    assert exceeded.payload["used"] == 2

    await feed(sched, work.id)
    with pytest.raises(NotEligibleError) as refused:
        await sched.claim(work.id)
    assert refused.value.code == "over_budget"
    (hold,) = await store.list_holds(work.id)
    assert hold.kind is HoldKind.BUDGET
    assert "two-turns" in hold.reason
    assert "2 of 2 turns" in hold.reason
    assert (await store.get_work(work.id)).status is WorkStatus.HELD
    assert "core.budget.held" in await event_types(store, work.id)
    listed = await needs_you(store)
    assert [(n.work_id, n.kind, n.reason) for n in listed] == [
        (work.id, HoldKind.BUDGET, hold.reason)
    ]
    assert f"conduit release {work.id}" in listed[0].settle

    # Input keeps queueing while held; a held Work is never claimed.
    await sched.accept_input(input_event(work.id, 2))
    assert (await store.get_work(work.id)).pending_inputs == 2  # the refused turn's and this
    claims, refusals = await sched.claim_ready(10)
    assert claims == []
    assert refusals == []

    # Releasing leaves exactly one pass: one more turn over budget, then held again.
    released = await sched.release_hold(work.id, reason="one more")
    assert released.budget_pass
    assert released.status is WorkStatus.READY
    claims, _ = await sched.claim_ready(10)
    assert [c.work.id for c in claims] == [work.id]
    assert not claims[0].work.budget_pass
    await sched.run_attempt(claims[0])
    await feed(sched, work.id)
    with pytest.raises(NotEligibleError) as again:
        await sched.claim(work.id)
    assert again.value.code == "over_budget"
    # Notified once per window, kind, limit and scope, however often the line is passed.
    assert len(await notices(store, "warning")) == 1
    assert len(await notices(store, "exceeded")) == 1
    ledger = (await store.list_ledgers())[0]
    assert ledger.used == 3
    assert ledger.exceeded


async def test_budgets_are_off_by_default(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler()
    work = await submit(sched, kind=WorkKind.STANDING, payload={"units": {"minutes": 50}})
    for _ in range(5):
        await run_one(sched, work.id)
    assert await sched.settle_budgets() == 0  # nothing staged, so nothing to charge
    assert await store.list_ledgers() == []
    assert await store.list_holds() == []
    assert await store.pending_usage() == []  # dropped without budgets
    assert await notices(store, "warning") == []
    assert await notices(store, "exceeded") == []


async def test_executor_usage_is_staged_once_and_charged_at_the_next_start_or_settle(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    minutes = Budget(name="minutes", unit="minutes", max=5, per="scope", warn_at=0.5)
    attempts = Budget(name="attempts", unit="attempts", max=10, per="all")
    sched = make_scheduler(budgets=(minutes, attempts))
    work = await submit(sched, kind=WorkKind.STANDING, payload={"units": {"minutes": 3}})

    claim = await run_one(sched, work.id)
    ended = await store.get_execution(claim.execution.id)
    assert ended.charged == {"minutes": 3}
    assert ended.charged_epoch == ended.epoch
    (staged,) = await store.pending_usage()
    assert staged.units == {"minutes": 3}
    assert await sched.settle_budgets() == 1
    assert await store.pending_usage() == []
    assert await sched.settle_budgets() == 0  # charged once
    by_budget = {ledger.budget: ledger for ledger in await store.list_ledgers()}
    assert by_budget["minutes"].used == 3
    assert by_budget["minutes"].subject == "scope:root"
    assert by_budget["attempts"].used == 1
    assert by_budget["attempts"].subject == "all"
    assert len(await notices(store, "warning")) == 1

    await sched.accept_input(input_event(work.id, 2, {"units": {"minutes": 3}}))
    await run_one(sched, work.id)  # 6 of 5 minutes, charged at the next start
    await feed(sched, work.id)
    with pytest.raises(NotEligibleError) as refused:
        await sched.claim(work.id)
    assert refused.value.code == "over_budget"
    (hold,) = await store.list_holds(work.id)
    assert "6 of 5 minutes" in hold.reason
    assert {ledger.budget: ledger.used for ledger in await store.list_ledgers()} == {
        "minutes": 6,
        "attempts": 2,
    }


async def test_a_day_budget_starts_a_new_ledger_and_new_notices_each_utc_day(
    make_scheduler: Callable[..., Scheduler], store: Store, clock: ManualClock
) -> None:
    daily = Budget(name="daily", unit="turns", max=1, per="work", period="day")
    sched = make_scheduler(budgets=(daily,))
    work = await submit(sched, kind=WorkKind.STANDING)
    await run_one(sched, work.id)
    await feed(sched, work.id)
    with pytest.raises(NotEligibleError):
        await sched.claim(work.id)
    clock.advance(DAY_MS)
    await sched.release_hold(work.id)
    await run_one(sched, work.id)  # the pass, spent on the new day's first turn
    assert len(await store.list_ledgers()) == 2
    assert len(await notices(store, "exceeded")) == 2


def test_budget_windows_are_utc_days_and_monday_weeks() -> None:
    now = 1_800_000_123_456
    assert window_start("life", now) == 0
    assert window_start("day", DAY_MS * 3 + 5) == DAY_MS * 3
    start = window_start("week", now)
    assert start <= now < start + WEEK_MS
    assert start % DAY_MS == 0
    assert (start // DAY_MS) % 7 == 4  # 1970-01-01 was a Thursday: day 4 was a Monday


# --- Start gates ----------------------------------------------------------------------------


async def test_start_gate_holds_the_first_start_and_only_it_settles(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler()
    work = await submit(sched, payload={"hold": "needs a review"})
    with pytest.raises(NotEligibleError) as held:
        await sched.claim(work.id)
    assert held.value.code == "gate_held"
    assert gate_calls(work.id) == ["test-allow"]  # asked in registration-name order, then held
    (hold,) = await store.list_holds(work.id)
    assert (hold.kind, hold.holder, hold.reason) == (HoldKind.GATE, "test-allow", "needs a review")
    assert (await store.get_work(work.id)).status is WorkStatus.HELD
    assert await event_types(store, work.id) == ["core.gate.held"]

    # Held Work is not asked again, and input keeps queueing.
    await sched.accept_input(input_event(work.id, 2))
    assert await sched.claim_ready(10) == ([], [])
    assert gate_calls(work.id) == ["test-allow"]

    # Another registration (or an operator's release) cannot settle it.
    with pytest.raises(ConduitError) as wrong:
        await sched.settle_gate_hold(work.id, "test-probe", admit=True)
    assert wrong.value.code == "no_gate_hold"
    with pytest.raises(ConduitError) as operator:
        await sched.release_hold(work.id)
    assert operator.value.code == "gate_hold"
    assert len(await store.list_holds(work.id)) == 1

    admitted = await sched.settle_gate_hold(work.id, "test-allow", admit=True, reason="looks ok")
    assert admitted.gate_pass
    assert admitted.status is WorkStatus.READY
    again = await sched.settle_gate_hold(work.id, "test-allow", admit=True, reason="looks ok")
    assert again.id == work.id  # idempotent
    assert await event_types(store, work.id) == ["core.gate.held", "core.gate.released"]
    released = [e for e in await store.work_events(work.id) if e.type == "core.gate.released"]
    assert released[0].payload["reason"] == "looks ok"
    assert not released[0].pending

    # The settled start runs without asking the gates again, and so do later attempts.
    claims, _ = await sched.claim_ready(10)
    assert [c.work.id for c in claims] == [work.id]
    assert not claims[0].work.gate_pass
    ended = await sched.run_attempt(claims[0])
    assert ended.status.terminal
    assert gate_calls(work.id) == ["test-allow"]
    assert await needs_you(store) == []


async def test_start_gate_pass_survives_a_budget_hold(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    one_turn = Budget(name="one-turn", unit="turns", max=1, per="all")
    sched = make_scheduler(budgets=(one_turn,))
    first = await submit(sched)
    await run_one(sched, first.id)
    work = await submit(sched, payload={"probe_hold": "approve me"})
    with pytest.raises(NotEligibleError) as held:
        await sched.claim(work.id)
    assert held.value.code == "gate_held"  # the gate's hold comes before budgets
    assert [h.kind for h in await store.list_holds(work.id)] == [HoldKind.GATE]
    await sched.settle_gate_hold(work.id, "test-probe", admit=True)

    with pytest.raises(NotEligibleError) as over:
        await sched.claim(work.id)
    assert over.value.code == "over_budget"
    held_work = await store.get_work(work.id)
    assert held_work.gate_pass  # not spent: the start was not admitted
    await sched.release_hold(work.id)
    claim = await sched.claim(work.id)
    assert not claim.work.gate_pass
    assert not claim.work.budget_pass
    assert gate_calls(work.id) == ["test-allow", "test-probe"]  # asked once, before the hold
    await sched.run_attempt(claim)


async def test_start_gates_wait_for_capacity(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler(concurrency=1)
    busy = await submit(sched)
    (busy_claim,), _ = await sched.claim_ready(10)
    waiting = await submit(sched)
    claims, refusals = await sched.claim_ready(10)
    # No slot is free: the claim reads none of the queue (no refusal row by row); the store
    # tells what waits for which limit when asked.
    assert (claims, refusals) == ([], [])
    refused = await store.capacity_refusal(sched.capacity(), await store.get_work(waiting.id))
    assert refused is not None
    assert refused.code == "capacity_concurrency"
    assert await store.capacity_waiting(sched.capacity()) == {"global": 1}
    assert gate_calls(waiting.id) == []  # never asked while capacity refuses the start
    with pytest.raises(ConduitError) as single:
        await sched.claim(waiting.id)
    assert single.value.code == "capacity_concurrency"
    assert gate_calls(waiting.id) == []

    await sched.run_attempt(busy_claim)
    claims, _ = await sched.claim_ready(10)
    assert [c.work.id for c in claims] == [waiting.id]
    assert gate_calls(waiting.id) == ["test-allow", "test-probe"]
    assert gate_calls(busy.id) == ["test-allow", "test-probe"]


async def test_the_deadline_counts_from_after_the_gates_were_asked(
    make_scheduler: Callable[..., Scheduler], clock: ManualClock
) -> None:
    sched = make_scheduler()
    work = await submit(sched)
    test_plugin.ON_ASK.append(lambda _: clock.advance(90_000))  # a gate that takes 90 s
    (claim,), _ = await sched.claim_ready(10)
    snap = claim.execution.snapshot
    assert gate_calls(work.id) == ["test-allow", "test-probe"]
    assert snap.deadline_ms == clock.now_ms() + round(snap.timeout_seconds * 1000)
    await sched.run_attempt(claim)


async def test_start_gate_refusal_cancels_the_work(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler()
    work = await submit(sched, payload={"hold": "risky"})
    with pytest.raises(NotEligibleError):
        await sched.claim(work.id)
    refused = await sched.settle_gate_hold(work.id, "test-allow", admit=False, reason="no")
    assert refused.status is WorkStatus.CANCELLED
    await sched.settle_gate_hold(work.id, "test-allow", admit=False, reason="no")  # idempotent
    with pytest.raises(ConduitError) as late:
        await sched.settle_gate_hold(work.id, "test-allow", admit=True)
    assert late.value.code == "gate_hold_settled"
    assert await event_types(store, work.id) == ["core.gate.held", "core.gate.refused"]
    assert await store.list_executions(work.id) == []
    assert await needs_you(store) == []
    with pytest.raises(NotEligibleError):
        await sched.claim(work.id)


async def test_an_undecided_start_gate_fails_closed(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler()
    undecided = await submit(sched, payload={"gate_error": True})
    ungated = await submit(sched)  # negative control: its gates let it start
    with pytest.raises(StartGateError) as failed:
        await sched.claim(undecided.id)
    assert failed.value.code == "start_gate_failed"
    assert await store.list_holds() == []
    claims, refusals = await sched.claim_ready(10)
    assert [c.work.id for c in claims] == [ungated.id]
    assert [(r.work_id, r.code) for r in refusals] == [(undecided.id, "start_gate_failed")]
    # Nothing held, so the next pass asks again.
    assert gate_calls(undecided.id) == ["test-allow", "test-probe"] * 2
    work = await store.get_work(undecided.id)
    assert work.status is WorkStatus.READY
    assert not work.gated
    assert await store.list_executions(undecided.id) == []
