"""What wakes Work: due timers (retries), manual retries, and events matching a parked wait.

A due clock alone never clears eligibility: a retry timer is fired once by accepting a
``core.retry`` event as the Work's input and clearing its backoff in the same transaction.
A retried attempt is shown the input it retries first (``presented_inputs``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Event, Execution, TimerKind, Work
from conduit_core.runtime import _policy as policy
from conduit_core.runtime._inputs import input_event
from conduit_core.storage import Claim

if TYPE_CHECKING:
    from conduit_core.runtime._scheduler import Scheduler

__all__ = [
    "accept_input",
    "fire_due_timers",
    "manual_retry",
    "presented_inputs",
    "run_resumed",
]

log = logging.getLogger("conduit.runtime")

_RETRY_TYPES = frozenset({policy.RETRY_EVENT_TYPE, policy.MANUAL_RETRY_EVENT_TYPE})


async def presented_inputs(sched: Scheduler, inputs: Sequence[Event]) -> list[Event]:
    """The inputs an attempt sees: a retry event brings back the input it retries first."""
    presented: list[Event] = []
    for event in inputs:
        if event.type in _RETRY_TYPES and isinstance(event.payload, dict):
            trigger = event.payload.get("trigger") or []
            originals = [await sched.store.get_event(i) for i in trigger if isinstance(i, str)]
            presented.extend(
                o for o in await presented_inputs(sched, originals) if o.type not in _RETRY_TYPES
            )
        presented.append(event)
    return presented


async def fire_due_timers(sched: Scheduler, *, limit: int = 100) -> list[str]:
    """Fire due timers once each (another driver may race us; the store decides who fires).

    A retry timer accepts a ``core.retry`` Event as the Work's input and clears its backoff
    in the same transaction: a due clock alone never clears eligibility.
    """
    fired: list[str] = []
    now = sched.clock.now_ms()
    for timer in await sched.store.due_timers(now_ms=now, limit=limit):
        accept: Event | None = None
        clear = None
        if timer.work_id is not None and timer.kind is TimerKind.RETRY:
            accept = Event(
                id=f"retry-event/{timer.id}/{timer.generation}",
                delivery_id=f"retry/{timer.id}/{timer.generation}",
                type=policy.RETRY_EVENT_TYPE,
                payload=dict(timer.payload),
                work_id=timer.work_id,
                pending=True,
                accepted_at_ms=now,
            )
            timer_id = timer.id

            def clear_backoff(work: Work, timer_id: str = timer_id) -> Work:
                if work.retry_timer_id != timer_id:
                    return work
                return msgspec.structs.replace(work, retry_timer_id=None)

            clear = clear_backoff
        if await sched.store.fire_timer(timer.id, accept=accept, update_work=clear, now_ms=now):
            fired.append(timer.id)
    return fired


async def manual_retry(sched: Scheduler, work_id: str, *, reason: str = "") -> Work:
    """``core.manual.retry``: reset the failure budget (not attempt numbering) and run again."""
    work = await sched.store.get_work(work_id)
    if work.status.terminal:
        raise ConduitError(f"work {work_id!r} is {work.status}", code="not_eligible")
    attempts = await sched.store.list_executions(work_id)
    trigger = list(attempts[-1].inputs) if attempts else []
    now = sched.clock.now_ms()
    if work.retry_timer_id is not None:
        await sched.store.disarm_timer(work.retry_timer_id)
    delivery = f"manual-retry/{work_id}/{work.last_attempt}/{now}"
    event = input_event(
        work_id, {"reason": reason, "trigger": trigger}, delivery_id=delivery, now=now,
        event_type=policy.MANUAL_RETRY_EVENT_TYPE,
    )  # fmt: skip
    await sched.store.accept_event(event)

    def reset(current: Work) -> Work:
        return msgspec.structs.replace(
            current, failure_count=0, blocked_reason=None, retry_timer_id=None
        )

    return await sched.store.update_work(work_id, reset, now_ms=now)


async def accept_input(sched: Scheduler, event: Event) -> tuple[Event, list[Claim]]:
    """Accept an event; wake parked attempts whose wait it matches (never their own Work's).

    Returns the stored event and the claims of resumed attempts (launch them with
    :func:`run_resumed`).
    """
    stored = await sched.store.accept_event(event)
    resumed: list[Claim] = []
    waits = await sched.store.matching_waits(
        event_type=stored.type, correlation_key=stored.correlation_key
    )
    for wait in waits:
        if stored.published_by is not None:
            publisher = await sched.store.get_execution(stored.published_by)
            if publisher.work_id == wait.work_id:
                continue  # a Work's own published events never wake it
        try:
            claim = await sched.store.resume_attempt(
                wait.execution_id, owner=sched.options.owner, now_ms=sched.clock.now_ms(),
                lease_ms=sched.options.lease_ms, wake_event_id=stored.id,
                capacity=sched.options.capacity(),
            )  # fmt: skip
        except ConduitError as exc:
            log.info("wait of %s not resumed: %s", wait.execution_id, exc)
            continue
        if wait.timer_id is not None:
            await sched.store.disarm_timer(wait.timer_id)
        resumed.append(claim)
    return stored, resumed


async def run_resumed(sched: Scheduler, claim: Claim) -> Execution:
    """Resume a woken attempt on its pinned executor, under a new segment, to its end."""
    execution = claim.execution
    wake_id = execution.segments[-1].wake_event_id if execution.segments else None
    wake = await sched.store.get_event(wake_id) if wake_id else None
    async with sched.hold(claim.lease) as held:
        remaining = execution.remaining_budget_ms or 0
        deadline = sched.clock.now_ms() + remaining

        def keep_budget(ex: Execution) -> Execution:
            snap = msgspec.structs.replace(ex.snapshot, deadline_ms=deadline)
            return msgspec.structs.replace(ex, snapshot=snap)

        execution = await sched.store.update_attempt(
            held.lease, keep_budget, now_ms=sched.clock.now_ms()
        )
        claim = msgspec.structs.replace(claim, execution=execution)
        launched = await sched.launch(claim, held, wake=wake)
        if isinstance(launched, Execution):
            return launched
        return await sched.observe(launched)
