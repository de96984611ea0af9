"""Recovery after lost authority: adopt what may still run, relaunch only what provably cannot.

Recover claims the same unfinished attempt at a higher epoch (the store ends the open segment
and begins a ``recovered`` one at the same instant, keeping the deadline), then either relaunches
it (``may_relaunch``) or asks the pinned generation's ``recover`` outside storage, whose answer
decides (docs/runtime.md, "Recovery decision"): a handle is adopted; ``NotStartedError`` is
relaunched like ``may_relaunch``; ``ResourcesGoneError`` is a counted failure with exclusion
confirmed; anything else cannot prove what still runs, so the attempt is *held*: unfinished,
holding its slot and blocking its Work, retried later, never turned into a retry that could run
the job twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from conduit_core.errors import ConduitError, LeaseLostError, UnsupportedGenerationError
from conduit_core.extension import (
    NotStartedError,
    OperationError,
    ResourcesGoneError,
    StopTarget,
)
from conduit_core.model import (
    Execution,
    ExecutionStatus,
    Invoke,
    Lease,
    RecoveryHold,
    Segment,
    Work,
)
from conduit_core.runtime import _policy as policy
from conduit_core.runtime._callbacks import StoreCallbacks
from conduit_core.runtime._holder import HeldLease
from conduit_core.runtime._policy import Transition
from conduit_core.storage import Claim

if TYPE_CHECKING:
    from conduit_core.runtime._scheduler import Attempt, Scheduler

__all__ = [
    "adopt",
    "claim_expired",
    "claim_held",
    "confirm_stopped_by",
    "hold",
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


async def claim_held(sched: Scheduler) -> list[Claim]:
    """Claim every held recovery now, without waiting for its backoff (a start or a reload may
    have brought the pinned generation back)."""
    claims: list[Claim] = []
    for execution in await sched.store.held_recoveries():
        try:
            claims.append(
                await sched.store.claim_recovery(
                    execution.id,
                    owner=sched.options.owner,
                    now_ms=sched.clock.now_ms(),
                    lease_ms=sched.options.lease_ms,
                )
            )
        except ConduitError as exc:
            log.info("held recovery of %s not claimed: %s", execution.id, exc)
    return claims


async def run_recovery(sched: Scheduler, claim: Claim) -> Execution:
    """Relaunch, adopt or hold a recovery claim under its held lease, and observe it to its end.

    Returns the ended attempt, or the still unfinished one when its recovery is held.
    """
    async with sched.hold(claim.lease) as held:
        launched: Attempt | Execution | None = None
        if not may_relaunch(claim.execution):
            launched = await adopt(sched, claim.execution, held)
        if launched is None:  # nothing can be running: relaunch, counting nothing
            launched = await _relaunch(sched, claim, held)
        if isinstance(launched, Execution):
            return launched
        return await sched.observe(launched)


async def _relaunch(sched: Scheduler, claim: Claim, held: HeldLease) -> Attempt | Execution:
    execution = await sched.store.update_attempt(
        held.lease, _mark_relaunched, now_ms=sched.clock.now_ms()
    )
    inputs = [await sched.store.get_event(i) for i in execution.inputs]
    lost = _lost_segment(execution)
    wake_id = lost.wake_event_id if lost is not None else None
    wake = await sched.store.get_event(wake_id) if wake_id else None
    log.info("relaunching execution=%s epoch=%s", execution.id, execution.epoch)
    relaunch = msgspec.structs.replace(claim, execution=execution, inputs=inputs)
    return await sched.launch(relaunch, held, wake=wake)


def _mark_relaunched(ex: Execution) -> Execution:
    seg = msgspec.structs.replace(ex.segments[-1], relaunched=True, invoke=Invoke.PENDING)
    return msgspec.structs.replace(ex, segments=[*ex.segments[:-1], seg], recovery_hold=None)


async def adopt(
    sched: Scheduler, execution: Execution, held: HeldLease
) -> Attempt | Execution | None:
    """Ask the pinned generation's ``recover`` what became of the attempt (the decision table).

    A handle → adopted (the Attempt); ``NotStartedError`` → ``None``: the caller relaunches;
    ``ResourcesGoneError`` → a counted failure with its exclusion confirmed; anything else, an
    uninstalled generation included → held (the unfinished Execution), never a retry.
    """
    from conduit_core.runtime._scheduler import Attempt

    snap = execution.snapshot
    try:
        executor = sched.plugins.executor(snap.executor, snap.executor_generation)
    except UnsupportedGenerationError as exc:
        settle = (
            f"reinstall a package that declares executor {snap.executor!r} generation "
            f"{snap.executor_generation} (recovery then proceeds by itself)"
        )
        return await hold(sched, execution, held, exc.code, exc.message, settle)
    callbacks = StoreCallbacks(sched.store, sched.clock, held)
    # The run environment is never asked for a recovery.
    ctx = sched.execution_context(execution, callbacks)
    try:
        handle = await executor.recover(ctx)
    except LeaseLostError:
        raise
    except NotStartedError as exc:
        log.info("recovery of %s found nothing started: %s", execution.id, exc.message)
        return None
    except ResourcesGoneError as exc:
        return await sched.fail_attempt(
            execution, held, exc.code, f"recovery found its resources gone: {exc.message}",
            confirmed=True,
        )  # fmt: skip
    except OperationError as exc:
        message = f"recovery could not tell what runs: {exc.code}: {exc.message}"
        settle = f"the executor {snap.executor!r} is asked again; see its logs"
        return await hold(sched, execution, held, exc.code, message, settle)
    except Exception as exc:
        message = f"recovery failed ({type(exc).__name__})"
        settle = f"the executor {snap.executor!r} is asked again; see its logs"
        return await hold(sched, execution, held, "recovery_failed", message, settle)
    lost = _lost_segment(execution)

    def running(ex: Execution) -> Execution:
        # The adopted segment carries what the lost one proved, so a later recovery adopts too.
        seg = ex.segments[-1]
        if lost is not None:
            seg = msgspec.structs.replace(seg, invoke=lost.invoke, isolated=lost.isolated)
        segments = [*ex.segments[:-1], seg]
        return msgspec.structs.replace(
            ex, status=ExecutionStatus.RUNNING, segments=segments, recovery_hold=None
        )

    execution = await callbacks.flush(running)
    return Attempt(execution=execution, held=held, context=ctx, executor=executor, handle=handle)


async def hold(
    sched: Scheduler, execution: Execution, held: HeldLease, code: str, message: str, how: str
) -> Execution:
    """Fail closed without failing: keep the attempt unfinished, its slot and its Work blocked,
    and try recovery again after ``recovery_retry_ms`` (or at once after a start or reload)."""
    now = sched.clock.now_ms()
    before = execution.recovery_hold
    settle = (
        f"{how}; or, once you know it no longer runs: conduit work confirm-stopped "
        f"{execution.work_id} --epoch {execution.epoch}"
    )
    recovery_hold = RecoveryHold(
        code=code,
        message=message,
        epoch=execution.epoch,
        since_ms=before.since_ms if before is not None else now,
        retry_at_ms=now + sched.options.recovery_retry_ms,
        tries=before.tries + 1 if before is not None else 1,
        settle=settle,
    )
    level = logging.ERROR if before is None else logging.INFO
    log.log(
        level, "recovery held execution=%s epoch=%s try=%d: [%s] %s",
        execution.id, execution.epoch, recovery_hold.tries, code, message,
    )  # fmt: skip
    async with held.ending_write():
        return await sched.store.hold_recovery(held.lease, recovery_hold, now_ms=now)


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
        launch_intent=execution.launch_intent,
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


async def confirm_stopped_by(
    sched: Scheduler, work_id: str, epoch: int, *, by: str, reason: str
) -> Execution:
    """A person's confirm-stopped for the Work's attempt that blocks it (see Scheduler)."""
    await sched.store.get_work(work_id)  # not_found for an unknown id
    blocking = [
        ex
        for ex in await sched.store.list_executions(work_id)
        if (ex.status.live and ex.recovery_hold is not None)
        or (ex.status.terminal and not ex.exclusion_confirmed)
    ]
    if not blocking:
        raise ConduitError(
            f"work {work_id!r} has no held attempt and none waiting for a stop confirmation "
            "(nothing was changed)",
            code="not_held",
        )
    # The live (held) one first, else the latest ended one.
    target = max(blocking, key=lambda ex: (ex.status.live, ex.attempt))
    now = sched.clock.now_ms()
    text = f"stop confirmed by {by}" + (f": {reason}" if reason else "")

    def settle(ex: Execution, work: Work) -> Transition:
        return policy.failure(
            ex, work, now_ms=now, code="stop_confirmed", message=text, exclusion_confirmed=True
        )

    confirmed = await sched.store.confirm_stopped(
        target.id, epoch, now_ms=now, by=by, reason=reason, settle=settle
    )
    log.warning("stop confirmed by a person execution=%s epoch=%s by=%s", target.id, epoch, by)
    return confirmed


async def handle_lost_lease(sched: Scheduler, lease: Lease) -> bool:
    """After a host lost a lease: stop and confirm only when recovery no longer owns it.

    A lease that merely lapsed on a running attempt is left for recovery to adopt. Returns
    whether a stop was confirmed.
    """
    if await sched.store.adoptable(lease):
        return False
    return await stop_and_confirm(sched, lease.execution_id)
