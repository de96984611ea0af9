"""Recovery after lost authority: adopt what may still run, relaunch only what provably cannot.

Recover claims the same unfinished attempt at a higher epoch (the store ends the open segment
and begins a ``recovered`` one at the same instant, keeping the deadline), then either relaunches
it (``may_relaunch``) or asks the pinned generation's ``recover`` outside storage, whose answer
decides (docs/runtime.md, "Recovery decision"): a handle is adopted; ``NotStartedError`` is
relaunched like ``may_relaunch``; ``ResourcesGoneError`` is a counted failure with exclusion
confirmed; anything else cannot prove what still runs, so the attempt is *held*: unfinished,
holding its slot and blocking its Work, retried later, never turned into a retry that could run
the job twice.

Two answers are never taken at their word. ``NotStartedError`` for a launch whose recovery
metadata the store acknowledged (``started_something``) contradicts the store: held. And past
the attempt's deadline nothing is relaunched (invariant 11): what never called its executor is
timed out; anything else is adopted (a job that ended by itself is settled by its result) or
stopped, timed out only when the stop is verified, and held, saying so, when it is not.
"""

from __future__ import annotations

import logging

import anyio
import msgspec

from conduit_core.errors import ConduitError, LeaseLostError, UnsupportedGenerationError
from conduit_core.extension import (
    ExecutionContext,
    Executor,
    NotStartedError,
    OperationError,
    ResourcesGoneError,
)
from conduit_core.model import (
    Execution,
    ExecutionStatus,
    Invoke,
    Segment,
    Work,
)
from conduit_core.plugins import Plugins
from conduit_core.runtime import _policy as policy
from conduit_core.runtime._attempts import Attempt, AttemptRunner
from conduit_core.runtime._callbacks import StoreCallbacks
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._counting import count_end
from conduit_core.runtime._holder import HeldLease
from conduit_core.runtime._options import SchedulerOptions
from conduit_core.runtime._policy import Transition
from conduit_core.storage import Claim, RecoveryRefusal, Store
from conduit_core.telemetry import METRICS

__all__ = ["Recovery", "may_relaunch", "deadline_passed", "started_something"]

log = logging.getLogger("conduit.runtime")

#: Recovery claims per store write (``Store.claim_recoveries``, one transaction each).
CLAIMS_PER_WRITE = 1000


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


def started_something(execution: Execution) -> bool:
    """The store proves the lost launch started something: its recovery metadata was
    acknowledged (in the lost segment, or in the launch it adopted)."""
    lost = _lost_segment(execution)
    if lost is not None and lost.recovery_persisted:
        return True
    # Segments written before they recorded it: an attempt that never resumed after a wait has
    # had one launch, so any metadata it holds is that launch's.
    return execution.recovery is not None and not any(s.wake_event_id for s in execution.segments)


def deadline_passed(execution: Execution, now_ms: int) -> bool:
    return execution.snapshot.deadline_ms <= now_ms


def _lost_segment(execution: Execution) -> Segment | None:
    # The recovery claim ended the lost segment and began the recovered one after it.
    return execution.segments[-2] if len(execution.segments) >= 2 else None


class Recovery:
    """Claims attempts that lost their holder and relaunches, adopts or holds each one.

    ``Recovery(store, clock, plugins, options, runner)``: the ``runner`` launches a relaunch
    and observes an adopted attempt exactly as it does a fresh one.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        plugins: Plugins,
        options: SchedulerOptions,
        runner: AttemptRunner,
    ) -> None:
        self.store = store
        self.clock = clock
        self.plugins = plugins
        self.options = options
        self.runner = runner
        self._deciding = anyio.CapacityLimiter(options.recovery_concurrency)

    # --- claims --------------------------------------------------------------------------------

    async def claim_expired(self, limit: int) -> list[Claim]:
        """Claim recovery of attempts whose lease expired or was released (a lost claim is
        skipped)."""
        now = self.clock.now_ms()
        expired = await self.store.expired_attempts(
            now_ms=now, limit=limit, skip_bindings=self.options.lacking_bindings
        )
        return await self._claim(self._runnable(expired), now, "recovery")

    async def take_over(self, owner: str) -> int:
        """Release every lease of ``owner`` in one transaction; returns how many.

        Only for an owner the caller proved dead (a daemon's predecessor on its data dir): its
        attempts become recoverable at once instead of at their leases' expiry, each still
        claimed at the next epoch, so nothing the dead owner might still write is accepted.
        """
        return await self.store.release_leases_of(owner, now_ms=self.clock.now_ms())

    async def claim_held(self) -> list[Claim]:
        """Claim every held recovery now, without waiting for its backoff (a start or a reload
        may have brought the pinned generation back)."""
        held = await self.store.held_recoveries()
        return await self._claim(self._runnable(held), self.clock.now_ms(), "held recovery")

    def _runnable(self, attempts: list[Execution]) -> list[str]:
        """The ids of the attempts this host may recover: a recovery may relaunch, so an attempt
        of a binding requiring a label this host lacks is left to a host that has it."""
        lacking = self.options.lacking_bindings
        if not lacking:
            return [ex.id for ex in attempts]
        return [ex.id for ex in attempts if ex.snapshot.binding not in lacking]

    async def _claim(self, execution_ids: list[str], now: int, what: str) -> list[Claim]:
        # Set-based: one store write claims a whole chunk (a few statements, not a few per
        # attempt), so a restart that adopts a thousand attempts pays one transaction.
        claims: list[Claim] = []
        for start in range(0, len(execution_ids), CLAIMS_PER_WRITE):
            results = await self.store.claim_recoveries(
                execution_ids[start : start + CLAIMS_PER_WRITE],
                owner=self.options.owner,
                # The claim's own instant: its lease counts from the claim, not from the read
                # that found it.
                now_ms=max(now, self.clock.now_ms()),
                lease_ms=self.options.lease_ms,
            )
            for result in results:
                if isinstance(result, RecoveryRefusal):
                    log.info("%s of %s not claimed: %s", what, result.execution_id, result.message)
                else:
                    claims.append(result)
        return claims

    # --- one recovery --------------------------------------------------------------------------

    async def run(self, claim: Claim) -> Execution:
        """Relaunch, adopt or hold a recovery claim under its held lease, and observe it to its
        end.

        Returns the ended attempt, or the still unfinished one when its recovery is held.
        """
        async with self.runner.hold(claim.lease) as held:
            # Bounded (``recovery_concurrency``): a restart that recovers a thousand attempts asks
            # the executors a few hundred at a time; observing them is not bounded.
            async with self._deciding:
                launched = await self._decide(claim, held)
            if isinstance(launched, Execution):
                return launched
            return await self.runner.observe(launched)

    async def _decide(self, claim: Claim, held: HeldLease) -> Attempt | Execution:
        decided = await self._decision(claim, held)
        if isinstance(decided, Execution) and not decided.segments[-1].relaunched:
            if decided.recovery_hold is not None:
                METRICS.recovery("held")
            elif decided.status is ExecutionStatus.TIMED_OUT:
                METRICS.recovery("timed_out")
            else:
                METRICS.recovery("resources_gone")
        return decided

    async def _decision(self, claim: Claim, held: HeldLease) -> Attempt | Execution:
        execution = claim.execution
        past = deadline_passed(execution, self.clock.now_ms())
        if may_relaunch(execution):
            if not past:  # nothing can be running: relaunch, counting nothing
                METRICS.recovery("relaunched")
                return await self._relaunch(claim, held)
            lost = _lost_segment(execution)
            if lost is not None and lost.invoke is Invoke.PENDING:
                # Its executor was never called: nothing ran, nothing to stop.
                return await self.runner.settle_timeout(
                    execution, held, verified=True,
                    why="its deadline passed before recovery; its executor was never called",
                )  # fmt: skip
            # Called after isolation was bound, nothing pinned: stop whatever was bound.
            return await self._stop_past_deadline(
                execution, held, "recovery_past_deadline", "its deadline passed before recovery"
            )
        launched = await self.adopt(execution, held, past_deadline=past)
        if launched is None:  # nothing started (and the store agrees): relaunch
            METRICS.recovery("relaunched")
            return await self._relaunch(claim, held)
        if isinstance(launched, Attempt):
            METRICS.recovery("adopted")
        return launched

    async def _relaunch(self, claim: Claim, held: HeldLease) -> Attempt | Execution:
        execution = await self.store.update_attempt(
            held.lease, _mark_relaunched, now_ms=self.clock.now_ms()
        )
        inputs = [await self.store.get_event(i) for i in execution.inputs]
        lost = _lost_segment(execution)
        wake_id = lost.wake_event_id if lost is not None else None
        wake = await self.store.get_event(wake_id) if wake_id else None
        log.info("relaunching execution=%s epoch=%s", execution.id, execution.epoch)
        relaunch = msgspec.structs.replace(claim, execution=execution, inputs=inputs)
        return await self.runner.launch(relaunch, held, wake=wake)

    async def adopt(
        self, execution: Execution, held: HeldLease, *, past_deadline: bool = False
    ) -> Attempt | Execution | None:
        """Ask the pinned generation's ``recover`` what became of the attempt (the decision
        table).

        A handle → adopted (the Attempt); ``NotStartedError`` → ``None``: the caller relaunches
        (held instead when the store proves something started); ``ResourcesGoneError`` → a
        counted failure with its exclusion confirmed; anything else, an uninstalled generation
        included → held (the unfinished Execution), never a retry. ``past_deadline``: never
        ``None``; what would be relaunched is timed out, what would be held is stopped first.
        """
        snap = execution.snapshot
        try:
            executor = self.plugins.executor(snap.executor, snap.executor_generation)
        except UnsupportedGenerationError as exc:
            return await self._hold_unsupported(execution, held, exc)
        callbacks = StoreCallbacks(self.store, self.clock, held)
        lost = _lost_segment(execution)
        if lost is not None:
            # The adopted segment carries what the lost one proved, so a later recovery adopts
            # too. Buffered: it goes with recover's own write of the recovery metadata.
            persisted = started_something(execution)

            def carried(seg: Segment) -> Segment:
                return msgspec.structs.replace(
                    seg, invoke=lost.invoke, isolated=lost.isolated,
                    recovery_persisted=seg.recovery_persisted or persisted,
                )  # fmt: skip

            callbacks.buffer_segment(carried)
        # The run environment is never asked for a recovery.
        ctx = self.runner.execution_context(execution, callbacks)
        try:
            handle = await executor.recover(ctx)
        except LeaseLostError:
            raise
        except NotStartedError as exc:
            if started_something(execution):
                # The executor contradicts the store: fail closed, as any unprovable recovery.
                message = (
                    f"recovery answered not_started ({exc.message}), but this launch's recovery "
                    "metadata was acknowledged: something was started, so it is not run again"
                )
                return await self._unprovable(
                    execution, held, ctx, executor, "recovery_contradicted", message, past_deadline
                )
            log.info("recovery of %s found nothing started: %s", execution.id, exc.message)
            if past_deadline:
                return await self.runner.settle_timeout(
                    execution, held, verified=True,
                    why="its deadline passed before recovery; recovery found nothing started",
                )  # fmt: skip
            return None
        except ResourcesGoneError as exc:
            return await self.runner.fail_attempt(
                execution, held, exc.code, f"recovery found its resources gone: {exc.message}",
                confirmed=True,
            )  # fmt: skip
        except OperationError as exc:
            message = f"recovery could not tell what runs: {exc.code}: {exc.message}"
            return await self._unprovable(
                execution, held, ctx, executor, exc.code, message, past_deadline
            )
        except Exception as exc:
            message = f"recovery failed ({type(exc).__name__})"
            return await self._unprovable(
                execution, held, ctx, executor, "recovery_failed", message, past_deadline
            )
        if callbacks.recovery_persisted and not callbacks.has_pending and callbacks.execution:
            # recover re-recorded the metadata under this epoch: that one write marked the
            # attempt running and carried the buffered segment, so adopting costs no second one.
            execution = callbacks.execution
        else:

            def running(ex: Execution) -> Execution:
                return msgspec.structs.replace(
                    ex, status=ExecutionStatus.RUNNING, recovery_hold=None
                )

            execution = await callbacks.flush(running)
        return Attempt(
            execution=execution, held=held, context=ctx, executor=executor, handle=handle
        )

    async def _unprovable(
        self,
        execution: Execution,
        held: HeldLease,
        ctx: ExecutionContext,
        executor: Executor,
        code: str,
        message: str,
        past_deadline: bool,
    ) -> Execution:
        """Recovery cannot prove what runs: held; past the deadline, stopped first."""
        if past_deadline:
            return await self._stop_past_deadline(execution, held, code, message, ctx, executor)
        settle = f"the executor {execution.snapshot.executor!r} is asked again; see its logs"
        return await self.hold(execution, held, code, message, settle)

    async def _stop_past_deadline(
        self,
        execution: Execution,
        held: HeldLease,
        code: str,
        why: str,
        ctx: ExecutionContext | None = None,
        executor: Executor | None = None,
    ) -> Execution:
        """Past its deadline: stop through the pinned executor; timed out when the stop is
        verified, held (saying so) when it is not."""
        snap = execution.snapshot
        if executor is None:
            try:
                executor = self.plugins.executor(snap.executor, snap.executor_generation)
            except UnsupportedGenerationError as exc:
                return await self._hold_unsupported(execution, held, exc)
        if ctx is None:
            ctx = self.runner.execution_context(
                execution, StoreCallbacks(self.store, self.clock, held)
            )
        verified, detail = await self.runner.stop_verified(executor, ctx.stop_target())
        if verified:
            return await self.runner.settle_timeout(
                execution, held, verified=True, why=f"{why}; stopped, the stop verified"
            )
        message = f"{why}; its deadline has passed and its stop was not verified" + (
            f": {detail}" if detail else ""
        )
        settle = (
            f"the stop through executor {snap.executor!r} is tried again (timed out once "
            "verified); see its logs"
        )
        return await self.hold(execution, held, code, message, settle)

    async def _hold_unsupported(
        self, execution: Execution, held: HeldLease, exc: UnsupportedGenerationError
    ) -> Execution:
        snap = execution.snapshot
        settle = (
            f"reinstall a package that declares executor {snap.executor!r} generation "
            f"{snap.executor_generation} (recovery then proceeds by itself)"
        )
        message = exc.message
        if deadline_passed(execution, self.clock.now_ms()):
            message += "; its deadline has passed, but without it nothing can stop it"
        return await self.hold(execution, held, exc.code, message, settle)

    async def hold(
        self, execution: Execution, held: HeldLease, code: str, message: str, how: str
    ) -> Execution:
        """Fail closed without failing (``AttemptRunner.hold_recovery``)."""
        return await self.runner.hold_recovery(execution, held, code, message, how)

    # --- a person's confirmation ---------------------------------------------------------------

    async def confirm_stopped_by(
        self, work_id: str, epoch: int, *, by: str, reason: str, actor: str | None = None
    ) -> Execution:
        """A person's confirm-stopped for the Work's attempt that blocks it (see Scheduler)."""
        await self.store.get_work(work_id)  # not_found for an unknown id
        blocking = [
            ex
            for ex in await self.store.list_executions(work_id)
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
        now = self.clock.now_ms()
        text = f"stop confirmed by {by}" + (f": {reason}" if reason else "")

        def settle(ex: Execution, work: Work) -> Transition:
            return policy.failure(
                ex, work, now_ms=now, code="stop_confirmed", message=text,
                exclusion_confirmed=True,
            )  # fmt: skip

        confirmed = await self.store.confirm_stopped(
            target.id, epoch, now_ms=now, by=by, reason=reason, settle=settle, actor=actor
        )
        if not target.status.terminal:
            count_end(confirmed)  # the held attempt ended here (an ended one was counted before)
        log.warning("stop confirmed by a person execution=%s epoch=%s by=%s", target.id, epoch, by)
        return confirmed


def _mark_relaunched(ex: Execution) -> Execution:
    seg = msgspec.structs.replace(
        ex.segments[-1], relaunched=True, invoke=Invoke.PENDING, recovery_persisted=False
    )
    return msgspec.structs.replace(ex, segments=[*ex.segments[:-1], seg], recovery_hold=None)
