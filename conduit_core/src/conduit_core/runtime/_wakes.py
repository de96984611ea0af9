"""What wakes Work: due timers (retries), manual retries, and events matching a parked wait.

A due clock alone never clears eligibility: a retry timer is fired once by accepting a
``core.retry`` event as the Work's input and clearing its backoff in the same transaction.
A retried attempt is shown the input it retries first (``_inputs.presented_inputs``).
"""

from __future__ import annotations

import logging

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Event, Execution, TimerKind, Work
from conduit_core.runtime import _policy as policy
from conduit_core.runtime._attempts import AttemptRunner
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._inputs import input_event
from conduit_core.runtime._options import SchedulerOptions
from conduit_core.storage import Claim, Store, WorkChange

__all__ = ["Wakes"]

log = logging.getLogger("conduit.runtime")


class Wakes:
    """``Wakes(store, clock, options, runner)``: timers, manual retries and matched waits; a
    resumed attempt runs through the ``runner`` like any other."""

    def __init__(
        self, store: Store, clock: Clock, options: SchedulerOptions, runner: AttemptRunner
    ) -> None:
        self.store = store
        self.clock = clock
        self.options = options
        self.runner = runner

    async def fire_due_timers(self, *, limit: int = 100) -> list[str]:
        """Fire due timers once each (another driver may race us; the store decides who fires).

        A retry timer accepts a ``core.retry`` Event as the Work's input and clears its backoff
        in the same transaction: a due clock alone never clears eligibility.
        """
        fired: list[str] = []
        now = self.clock.now_ms()
        for timer in await self.store.due_timers(now_ms=now, limit=limit):
            accept: Event | None = None
            clear: WorkChange | None = None
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
            elif timer.work_id is not None and timer.kind is TimerKind.DEBOUNCE:
                clear = _release_debounce(timer.id)
            if await self.store.fire_timer(timer.id, accept=accept, update_work=clear, now_ms=now):
                fired.append(timer.id)
        return fired

    async def manual_retry(
        self, work_id: str, *, reason: str = "", actor: str | None = None
    ) -> Work:
        """``core.manual.retry``: reset the failure budget (not attempt numbering) and run again."""
        work = await self.store.get_work(work_id)
        if work.status.terminal:
            raise ConduitError(f"work {work_id!r} is {work.status}", code="not_eligible")
        attempts = await self.store.list_executions(work_id)
        trigger = list(attempts[-1].inputs) if attempts else []
        now = self.clock.now_ms()
        if work.retry_timer_id is not None:
            await self.store.disarm_timer(work.retry_timer_id)
        delivery = f"manual-retry/{work_id}/{work.last_attempt}/{now}"
        event = input_event(
            work_id, {"reason": reason, "trigger": trigger}, delivery_id=delivery, now=now,
            event_type=policy.MANUAL_RETRY_EVENT_TYPE,
        )  # fmt: skip
        await self.store.accept_event(msgspec.structs.replace(event, actor=actor))

        def reset(current: Work) -> Work:
            return msgspec.structs.replace(
                current, failure_count=0, blocked_reason=None, retry_timer_id=None
            )

        return await self.store.update_work(work_id, reset, now_ms=now)

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]:
        """Accept an event; wake parked attempts whose wait it matches (never their own Work's).

        Returns the stored event and the claims of resumed attempts (launch them with
        :func:`run_resumed`).
        """
        stored = await self.store.accept_event(event)
        resumed: list[Claim] = []
        waits = await self.store.matching_waits(
            event_type=stored.type, correlation_key=stored.correlation_key
        )
        for wait in waits:
            if stored.published_by is not None:
                publisher = await self.store.get_execution(stored.published_by)
                if publisher.work_id == wait.work_id:
                    continue  # a Work's own published events never wake it
            try:
                claim = await self.store.resume_attempt(
                    wait.execution_id, owner=self.options.owner, now_ms=self.clock.now_ms(),
                    lease_ms=self.options.lease_ms, wake_event_id=stored.id,
                    capacity=self.options.capacity(),
                )  # fmt: skip
            except ConduitError as exc:
                log.info("wait of %s not resumed: %s", wait.execution_id, exc)
                continue
            if wait.timer_id is not None:
                await self.store.disarm_timer(wait.timer_id)
            resumed.append(claim)
        return stored, resumed

    async def run_resumed(self, claim: Claim) -> Execution:
        """Resume a woken attempt on its pinned executor, under a new segment, to its end."""
        execution = claim.execution
        wake_id = execution.segments[-1].wake_event_id if execution.segments else None
        wake = await self.store.get_event(wake_id) if wake_id else None
        async with self.runner.hold(claim.lease) as held:
            remaining = execution.remaining_budget_ms or 0
            deadline = self.clock.now_ms() + remaining

            def keep_budget(ex: Execution) -> Execution:
                snap = msgspec.structs.replace(ex.snapshot, deadline_ms=deadline)
                return msgspec.structs.replace(ex, snapshot=snap)

            execution = await self.store.update_attempt(
                held.lease, keep_budget, now_ms=self.clock.now_ms()
            )
            claim = msgspec.structs.replace(claim, execution=execution)
            launched = await self.runner.launch(claim, held, wake=wake)
            if isinstance(launched, Execution):
                return launched
            return await self.runner.observe(launched)


def _release_debounce(timer_id: str) -> WorkChange:
    """The debounce's quiet period (or max wait) is over: the Work may start. Only the timer the
    Work names releases it (a push replaced any older one under the key's lock)."""

    def release(work: Work) -> Work:
        if work.debounce is None or work.debounce.timer_id != timer_id:
            return work
        return msgspec.structs.replace(work, debounce=None)

    return release
