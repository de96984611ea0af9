"""Recovery after lost authority: adopt what may still run, relaunch only what provably cannot.

Recover claims the same unfinished attempt at a higher epoch (the store ends the open segment
and begins a ``recovered`` one at the same instant, keeping the deadline), then either relaunches
it or calls the pinned generation's ``recover`` outside storage.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from conduit_core.errors import ConduitError, LeaseLostError, UnsupportedGenerationError
from conduit_core.extension import OperationError, StopTarget
from conduit_core.model import Execution, ExecutionStatus, Invoke, Lease, Segment
from conduit_core.runtime._callbacks import StoreCallbacks
from conduit_core.runtime._holder import HeldLease
from conduit_core.storage import Claim

if TYPE_CHECKING:
    from conduit_core.runtime._scheduler import Attempt, Scheduler

__all__ = [
    "adopt",
    "claim_expired",
    "handle_lost_lease",
    "may_relaunch",
    "run_recovery",
    "stop_and_confirm",
]

log = logging.getLogger("conduit.runtime")


def may_relaunch(execution: Execution) -> bool:
    """Relaunch only a launch that lost its lease before it could have started anything.

    Its lost segment pinned nothing, and either its executor was never called (``pending``) or
    it was called only after isolation was bound (``called`` + ``isolated``, which holds every
    process until it is pinned). A segment without an invoke record proves neither: adopt.
    """
    lost = _lost_segment(execution)
    if lost is None or lost.pin is not None or lost.invoke is None:
        return False
    return lost.invoke is Invoke.PENDING or lost.isolated


def _lost_segment(execution: Execution) -> Segment | None:
    # The recovery claim ended the lost segment and began the recovered one after it.
    return execution.segments[-2] if len(execution.segments) >= 2 else None


async def claim_expired(sched: Scheduler, limit: int) -> list[Claim]:
    """Claim recovery of attempts whose lease expired or was released (a lost claim is skipped)."""
    claims: list[Claim] = []
    now = sched.clock.now_ms()
    for execution in await sched.store.expired_attempts(now_ms=now, limit=limit):
        try:
            claims.append(
                await sched.store.claim_recovery(
                    execution.id,
                    owner=sched.options.owner,
                    now_ms=now,
                    lease_ms=sched.options.lease_ms,
                )
            )
        except ConduitError as exc:
            log.info("recovery of %s not claimed: %s", execution.id, exc)
    return claims


async def run_recovery(sched: Scheduler, claim: Claim) -> Execution:
    """Relaunch or adopt a recovery claim under its held lease, and observe it to its end."""
    async with sched.hold(claim.lease) as held:
        execution = claim.execution
        if may_relaunch(execution):
            execution = await sched.store.update_attempt(
                held.lease, _mark_relaunched, now_ms=sched.clock.now_ms()
            )
            inputs = [await sched.store.get_event(i) for i in execution.inputs]
            lost = _lost_segment(execution)
            wake_id = lost.wake_event_id if lost is not None else None
            wake = await sched.store.get_event(wake_id) if wake_id else None
            log.info("relaunching execution=%s epoch=%s", execution.id, execution.epoch)
            relaunch = msgspec.structs.replace(claim, execution=execution, inputs=inputs)
            launched = await sched.launch(relaunch, held, wake=wake)
        else:
            launched = await adopt(sched, execution, held)
        if isinstance(launched, Execution):
            return launched
        return await sched.observe(launched)


def _mark_relaunched(ex: Execution) -> Execution:
    seg = msgspec.structs.replace(ex.segments[-1], relaunched=True, invoke=Invoke.PENDING)
    return msgspec.structs.replace(ex, segments=[*ex.segments[:-1], seg])


async def adopt(sched: Scheduler, execution: Execution, held: HeldLease) -> Attempt | Execution:
    """Re-attach through the pinned generation's ``recover``; fail closed, keeping the hold."""
    from conduit_core.runtime._scheduler import Attempt

    snap = execution.snapshot
    try:
        executor = sched.plugins.executor(snap.executor, snap.executor_generation)
    except UnsupportedGenerationError as exc:
        log.error(
            "cannot recover execution=%s epoch=%s: %s", execution.id, execution.epoch, exc.message
        )
        return await sched.fail_attempt(execution, held, exc.code, exc.message)
    callbacks = StoreCallbacks(sched.store, sched.clock, held)
    # The run environment is never asked for a recovery.
    ctx = sched.execution_context(execution, callbacks)
    try:
        handle = await executor.recover(ctx)
    except LeaseLostError:
        raise
    except OperationError as exc:
        return await sched.fail_attempt(
            execution, held, exc.code, f"recovery failed: {exc.code}: {exc.message}"
        )
    except Exception as exc:
        return await sched.fail_attempt(
            execution, held, "recovery_failed", f"recovery failed ({type(exc).__name__})"
        )
    lost = _lost_segment(execution)

    def running(ex: Execution) -> Execution:
        # The adopted segment carries what the lost one proved, so a later recovery adopts too.
        seg = ex.segments[-1]
        if lost is not None:
            seg = msgspec.structs.replace(seg, invoke=lost.invoke, isolated=lost.isolated)
        segments = [*ex.segments[:-1], seg]
        return msgspec.structs.replace(ex, status=ExecutionStatus.RUNNING, segments=segments)

    execution = await callbacks.flush(running)
    return Attempt(execution=execution, held=held, context=ctx, executor=executor, handle=handle)


async def stop_and_confirm(sched: Scheduler, execution_id: str) -> bool:
    """Stop what the attempt may have left running and confirm its exclusion when verified."""
    execution = await sched.store.get_execution(execution_id)
    if execution.exclusion_confirmed:
        return True
    snap = execution.snapshot
    try:
        executor = sched.plugins.executor(snap.executor, snap.executor_generation)
    except UnsupportedGenerationError as exc:
        log.error("cannot stop execution=%s: %s", execution.id, exc.message)
        return False
    target = StopTarget(
        execution_id=execution.id,
        epoch=execution.epoch,
        work_id=execution.work_id,
        config=dict(snap.binding_config),
        recovery=execution.recovery,
    )
    try:
        evidence = await executor.stop(target)
    except Exception as exc:
        log.warning(
            "stop failed execution=%s epoch=%s cause=%s",
            execution.id, execution.epoch, type(exc).__name__,
        )  # fmt: skip
        return False
    if not evidence.verified:
        return False
    try:
        await sched.store.confirm_stopped(
            execution.id, execution.epoch, now_ms=sched.clock.now_ms()
        )
    except LeaseLostError:
        return False  # adopted at another epoch since: not ours to confirm
    return True


async def handle_lost_lease(sched: Scheduler, lease: Lease) -> bool:
    """After a host lost a lease: stop and confirm only when recovery no longer owns it.

    A lease that merely lapsed on a running attempt is left for recovery to adopt. Returns
    whether a stop was confirmed.
    """
    if await sched.store.adoptable(lease):
        return False
    return await stop_and_confirm(sched, lease.execution_id)
