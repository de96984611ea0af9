"""Controls: inject and interrupt dispatched to the pinned executor, and Work cancellation.

An intent is durable; ``dispatch_controls`` claims it under a fresh dispatch token, performs it
outside storage through the attempt's pinned executor and capabilities, and settles it only with
that same token. Acknowledging an inject means accepted, not consumed; a result's consumed inputs
settle it as consumed. An interrupt fences the attempt and leaves the Work ready before the
control is sent, and the attempt's resources stay held until the stop is verified.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

import msgspec

from conduit_core.errors import LeaseLostError
from conduit_core.extension import Capability, NotAcceptingError
from conduit_core.model import (
    ControlIntent,
    ControlKind,
    ControlStatus,
    ErrorFallback,
    Event,
    Execution,
    ExecutionStatus,
    Work,
)
from conduit_core.plugins import Plugins
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._counting import count_end
from conduit_core.runtime._inputs import INPUT_EVENT_TYPE, input_event, presented
from conduit_core.runtime._stops import Stops
from conduit_core.storage import NotEligibleError, StaleDispatchError, Store

__all__ = ["Controls"]

log = logging.getLogger("conduit.runtime")

_WAITING = (ExecutionStatus.LAUNCHING, ExecutionStatus.RESUMING, ExecutionStatus.RECOVERING)


class Controls:
    """``Controls(store, clock, plugins, stops)``: inject, interrupt, cancel and the dispatch
    of their intents; ``stops`` stops what a cancelled Work's attempts started."""

    def __init__(self, store: Store, clock: Clock, plugins: Plugins, stops: Stops) -> None:
        self.store = store
        self.clock = clock
        self.plugins = plugins
        self.stops = stops

    async def inject(
        self,
        work_id: str,
        payload: Any,
        *,
        delivery_id: str | None = None,
        event_type: str = INPUT_EVENT_TYPE,
        correlation_key: str | None = None,
        actor: str | None = None,
    ) -> tuple[Event, ControlIntent | None]:
        """Queue input for the Work and, when an attempt that takes input runs, an inject intent."""
        now = self.clock.now_ms()
        delivery = delivery_id or f"inject/{uuid.uuid4().hex}"
        queued = input_event(
            work_id, payload, delivery_id=delivery, now=now, event_type=event_type,
            correlation_key=correlation_key,
        )  # fmt: skip
        event = await self.store.accept_event(msgspec.structs.replace(queued, actor=actor))
        live = [e for e in await self.store.list_executions(work_id) if e.status.live]
        if not live or Capability.INJECT not in live[-1].snapshot.capabilities:
            return event, None  # queued for the next attempt
        ex = live[-1]
        intent = await self.store.create_control(
            ControlIntent(
                id=f"inject/{event.id}",
                work_id=work_id,
                execution_id=ex.id,
                epoch=ex.epoch,
                kind=ControlKind.INJECT,
                input_ids=[event.id],
                fallback=ex.snapshot.control_fallback,
                created_at_ms=now,
                actor=actor,
            )
        )
        return event, intent

    async def interrupt(self, work_id: str, *, actor: str | None = None) -> ControlIntent:
        """Fence the running attempt, leave the Work ready, and queue the interrupt for dispatch."""
        intent = await self.store.interrupt_work(
            work_id, f"interrupt/{uuid.uuid4().hex}", now_ms=self.clock.now_ms(), actor=actor
        )
        count_end(await self.store.get_execution(intent.execution_id))  # fenced: it ended here
        return intent

    async def cancel_work(
        self, work_id: str, *, stop: bool = True, actor: str | None = None
    ) -> Work:
        """Cancel atomically (attempts, waits, owned timers, eligibility), then stop what ran.

        ``stop=False`` leaves the stops to a host whose passes stop every ended attempt whose
        exclusion is unconfirmed (the daemon: the caller then never waits on an executor)."""
        now = self.clock.now_ms()
        work = await self.store.cancel_work(work_id, now_ms=now, actor=actor)
        for ex in await self.store.list_executions(work_id):
            if ex.status is ExecutionStatus.CANCELLED and ex.ended_at_ms == now:
                count_end(ex)  # an attempt this cancel ended (not hot: a person's action)
            if stop and not ex.exclusion_confirmed:
                await self.stops.stop_and_confirm(ex.id)
        return work

    async def dispatch_controls(self, *, limit: int = 100) -> int:
        """Dispatch open intents once each; an intent for an attempt still launching waits."""
        settled = 0
        for intent in await self.store.open_controls(limit=limit):
            settled += await self.dispatch(intent)
        return settled

    async def dispatch(self, intent: ControlIntent) -> int:
        """Dispatch one open intent; 1 when it was settled (0: it waits, or another won)."""
        ex = await self.store.get_execution(intent.execution_id)
        if intent.kind is ControlKind.INJECT:
            return await self._dispatch_inject(intent, ex)
        return await self._dispatch_interrupt(intent, ex)

    async def _claim(self, intent: ControlIntent) -> str | None:
        """The dispatch token, or ``None`` when another dispatch already claimed or settled the
        intent (a host's read of open intents races the settle of the one before)."""
        try:
            claimed = await self.store.claim_control(intent.id, now_ms=self.clock.now_ms())
        except NotEligibleError:
            return None
        return claimed.dispatch_token or ""

    async def _dispatch_inject(self, intent: ControlIntent, ex: Execution) -> int:
        if ex.epoch == intent.epoch and ex.status in _WAITING:
            return 0  # still launching, resuming or recovering: a later pass finds it launched
        token = await self._claim(intent)
        if token is None:
            return 0
        if ex.epoch != intent.epoch or not ex.status.live:
            # A completed target or a superseded epoch is never retargeted: the input stays queued.
            return await self._settle(intent, token, ControlStatus.FAILED)
        if Capability.INJECT not in ex.snapshot.capabilities:
            # Only the pinned capabilities count: a newer registration cannot grant one.
            return await self._settle(intent, token, ControlStatus.NOT_ACCEPTING)
        try:
            executor = self.plugins.executor(ex.snapshot.executor, ex.snapshot.executor_generation)
            inputs = [presented(await self.store.get_event(i)) for i in intent.input_ids]
            await executor.inject(self.stops.target(ex), inputs)
        except NotAcceptingError:
            return await self._settle(intent, token, ControlStatus.NOT_ACCEPTING)
        except Exception as exc:  # UnsupportedGenerationError included: fall back, never swap
            log.warning(
                "inject failed execution=%s epoch=%s cause=%s",
                ex.id, ex.epoch, getattr(exc, "code", type(exc).__name__),
            )  # fmt: skip
            if intent.fallback is ErrorFallback.DROP:
                await self.store.drop_inputs(intent.work_id, intent.input_ids)
                return await self._settle(intent, token, ControlStatus.DROPPED)
            return await self._settle(intent, token, ControlStatus.FAILED)
        return await self._settle(intent, token, ControlStatus.ACKNOWLEDGED)

    async def _dispatch_interrupt(self, intent: ControlIntent, ex: Execution) -> int:
        token = await self._claim(intent)
        if token is None:
            return 0
        target = self.stops.target(ex, epoch=intent.epoch)
        verified = False
        try:
            executor = self.plugins.executor(ex.snapshot.executor, ex.snapshot.executor_generation)
            if Capability.INTERRUPT in ex.snapshot.capabilities:
                evidence = await executor.interrupt(target)
            else:
                evidence = await executor.stop(target)
            verified = evidence.verified
        except Exception as exc:
            log.warning(
                "interrupt failed execution=%s epoch=%s cause=%s",
                ex.id, intent.epoch, getattr(exc, "code", type(exc).__name__),
            )  # fmt: skip
        if verified:
            # Adopted at another epoch since? Then it is not ours to confirm.
            with contextlib.suppress(LeaseLostError):
                await self.store.confirm_stopped(ex.id, intent.epoch, now_ms=self.clock.now_ms())
        # The request was sent; the resource hold stays until a verified stop confirms it.
        status = ControlStatus.ACKNOWLEDGED if verified else ControlStatus.FAILED
        return await self._settle(intent, token, status)

    async def _settle(self, intent: ControlIntent, token: str, status: ControlStatus) -> int:
        try:
            await self.store.settle_control(intent.id, token, status, now_ms=self.clock.now_ms())
        except StaleDispatchError:
            # Settled meanwhile (a result consumed the input) or re-dispatched: theirs wins.
            return 0
        return 1
