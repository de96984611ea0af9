"""Running attempts: pin, launch, observe and settle one attempt under its held lease.

Executor calls run outside every storage transaction, under the attempt's lease; each outcome is
applied in one fenced transaction. Claims (``Scheduler``, ``Admission``), recovery
(``Recovery``) and wakes (``Wakes``) hand their claims to this runner, which knows nothing of
them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import anyio

from conduit_core.errors import (
    ConduitError,
    LeaseLostError,
    StoreError,
    UnsupportedGenerationError,
    is_store_outage,
)
from conduit_core.extension import (
    CannotTellError,
    Capability,
    ExecutionContext,
    Executor,
    Handle,
    InputEvent,
    LostSightError,
    NotStartedError,
    OperationError,
    OutcomeKind,
    PhaseOutcome,
    Result,
    RetryHint,
    StopTarget,
    validate_result,
)
from conduit_core.model import (
    AttemptSnapshot,
    ErrorFallback,
    Event,
    Execution,
    ExecutionStatus,
    HandoffPolicy,
    Lease,
    RecoveryHold,
    RetryPolicy,
    Work,
)
from conduit_core.plugins import Plugins
from conduit_core.runtime import _policy as policy
from conduit_core.runtime._callbacks import StoreCallbacks
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._counting import count_end, count_start, traced
from conduit_core.runtime._holder import HeldLease, LeaseKeeper, hold_lease
from conduit_core.runtime._inputs import presented, presented_inputs
from conduit_core.runtime._options import SchedulerOptions
from conduit_core.storage import Claim, Store

__all__ = ["Attempt", "AttemptRunner"]

log = logging.getLogger("conduit.runtime")

#: How long observation waits before writing a launch trail it would rather write with the end.
QUICK_OBSERVE_S = 0.05
#: A deadline this far behind the clock when it fires passed while this host could not look (it
#: was paused, say); so did one that passed before observation began (a recovery's adoption).
LATE_SLACK_MS = 1_000
#: Then the handle gets this long to report a result the job already has: a job that ended by
#: itself while nobody looked is settled by its result, not timed out and run again. Reading
#: that result can take seconds on a loaded host: the shell executor proves the job left no
#: process behind (a scan of the machine's processes), and a successor adopting a paused
#: daemon's attempts does that for each at once. With 2 s, 30 adopted at once with both cores
#: busy and ~500 processes missed it, and jobs that had ended ran again by their retry
#: (``tests/faults/test_paused_past_deadline.py``). The cost: a job still running when a late
#: host looks runs up to this long past its deadline before its stop.
LATE_LOOK_S = 10.0


@dataclass
class Attempt:
    """A launched attempt: its held lease, context and the executor's handle."""

    execution: Execution
    held: HeldLease
    context: ExecutionContext
    executor: Executor
    handle: Handle
    #: The attempt's fenced callbacks, with any launch trail not yet written.
    callbacks: StoreCallbacks | None = None

    @property
    def lease(self) -> Lease:
        return self.held.lease


@dataclass(frozen=True, slots=True)
class _ObserveFailed:
    """Observing the attempt raised ``error`` (``AttemptRunner._wait``)."""

    error: Exception


class AttemptRunner:
    """Pins, launches, observes and settles attempts; holds their leases.

    ``AttemptRunner(store, clock, plugins, options)``: the options are the scheduler's (already
    copied), so a pin and a launch read the same ones.
    """

    def __init__(
        self, store: Store, clock: Clock, plugins: Plugins, options: SchedulerOptions
    ) -> None:
        self.store = store
        self.clock = clock
        self.plugins = plugins
        self.options = options
        self._keeper: LeaseKeeper | None = None
        #: Called as each attempt's settlement is sent (``Scheduler.set_settling_listener``).
        self.on_settling: Callable[[], None] | None = None

    def pin(self, work: Work) -> AttemptSnapshot:
        """Pin everything the attempt will run with, from the current bindings and manifests."""
        opts = self.options
        binding = opts.bindings.get(work.binding)
        if binding is None:
            raise ConduitError(f"unknown binding {work.binding!r}", code="unknown_binding")
        info = self.plugins.executor_info(binding.executor)
        generation = binding.generation or info.generation
        self.plugins.executor(binding.executor, generation)  # unsupported → refuse, never swap
        timeout_ms = (
            int(binding.timeout_seconds * 1000) if binding.timeout_seconds else opts.timeout_ms
        )
        delays = (
            [float(d) for d in binding.retry_delays_seconds]
            if binding.retry_delays_seconds is not None
            else [d / 1000 for d in opts.retry_delays_ms]
        )
        return AttemptSnapshot(
            config_generation=opts.config_generation,
            binding=work.binding,
            binding_config=dict(binding.config),
            executor=binding.executor,
            executor_generation=generation,
            pool=info.pool,
            capabilities=[Capability(c) for c in info.capabilities],
            retry_policy=RetryPolicy(
                delays_seconds=delays, terminal_on_exhaustion=binding.terminal_on_exhaustion
            ),
            timeout_seconds=timeout_ms / 1000,
            deadline_ms=self.clock.now_ms() + timeout_ms,
            control_fallback=ErrorFallback(binding.control_fallback),
            handoff_policy=HandoffPolicy(binding.handoff),
        )

    def hold(self, lease: Lease) -> AbstractAsyncContextManager[HeldLease]:
        """Renew ``lease`` every third of its duration while the body runs.

        Inside :meth:`keeping_leases` one keeper task renews every held lease; otherwise the hold
        runs its own renewal task (see ``hold_lease``).
        """
        if self._keeper is not None:
            return self._keeper.hold(lease)
        return hold_lease(self.store, self.clock, lease)

    @asynccontextmanager
    async def keeping_leases(self) -> AsyncIterator[None]:
        """Run one lease keeper for every attempt this scheduler holds (hosts use this)."""
        keeper = LeaseKeeper(self.store, self.clock)
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run)
            self._keeper = keeper
            try:
                yield
            finally:
                self._keeper = None
                tg.cancel_scope.cancel()

    async def launch(
        self, claim: Claim, held: HeldLease | None = None, *, wake: Event | None = None
    ) -> Attempt | Execution:
        """Launch a claimed attempt outside storage; returns the Attempt, or the failed Execution.

        Without ``held`` the lease is not renewed (a host that holds it elsewhere passes its own).
        """
        held = held or HeldLease(claim.lease)
        execution = claim.execution
        snap = execution.snapshot
        try:
            executor = self.plugins.executor(snap.executor, snap.executor_generation)
        except UnsupportedGenerationError as exc:
            return await self._fail(execution, held, exc.code, exc.message, confirmed=True)
        callbacks = StoreCallbacks(self.store, self.clock, held)
        callbacks.buffer_begin("environment")
        try:
            env = self.plugins.run_environment(self.options.scope_chain(execution.scope))
        except ConduitError as exc:
            callbacks.buffer_end("environment", PhaseOutcome.FAILED)
            await callbacks.flush()
            # The executor was never called: nothing can be running.
            return await self._fail(execution, held, exc.code, exc.message, confirmed=True)
        callbacks.buffer_end("environment", PhaseOutcome.OK)
        if self.clock.now_ms() >= snap.deadline_ms:
            # Claimed, then this host stalled (paused, starved) past the deadline before the
            # launch: launching now would start a job only to stop it, and its retry would run it
            # again. Timed out with nothing started; the retry runs it, once.
            return await self.settle_timeout(
                execution, held, verified=True, trail=callbacks,
                why="its deadline passed before its launch; its executor was never called",
            )  # fmt: skip
        ctx = self.execution_context(
            execution,
            callbacks,
            inputs=[presented(e) for e in await presented_inputs(self.store, claim.inputs)],
            env=env,
        )
        # One fenced write just before the executor is called: the trail so far, Invoke called
        # (with Isolated) and the executor phase begun. An executor that writes first
        # (``writes_first``: a fenced context write before it starts anything) carries it in
        # that write instead: until then nothing of the launch can run, as ``pending`` says.
        callbacks.buffer_invoked(isolated=Capability.ISOLATED in snap.capabilities)
        callbacks.buffer_begin("executor")
        if wake is not None or Capability.WRITES_FIRST not in snap.capabilities:
            await callbacks.flush()
        try:
            if wake is not None:
                handle = await executor.resume(ctx, presented(wake))
            else:
                handle = await executor.run(ctx)
        except LeaseLostError:
            raise
        except ConduitError as exc:
            if is_store_outage(exc):
                # The store did not answer a launch write (recovery metadata, say): whatever
                # the executor started may run, and failing the attempt now would run it again.
                # The host keeps the lease and releases it once the store answers; recovery then
                # adopts the launch by its metadata or its launch intent.
                raise
            return await self._launch_failed(execution, held, callbacks, executor, exc)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                callbacks.buffer_end("executor", PhaseOutcome.CANCELLED)
                raise
            return await self._launch_failed(execution, held, callbacks, executor, exc)
        callbacks.buffer_end("executor", PhaseOutcome.OK)
        if not callbacks.recovery_persisted:
            await callbacks.flush()
            # The executor contract requires recovery metadata before a handle: without it the
            # launch is ambiguous, so fail safe and keep the resource hold.
            return await self._fail(
                execution, held, "launch_unacknowledged",
                "the executor returned a handle without persisting recovery metadata",
            )  # fmt: skip
        # Recovery metadata marked the attempt running; the executor phase's end is written with
        # the next write (at once if the attempt outlives QUICK_OBSERVE_S, see observe).
        execution = callbacks.execution or execution
        return Attempt(
            execution=execution, held=held, context=ctx, executor=executor, handle=handle,
            callbacks=callbacks,
        )  # fmt: skip

    async def _launch_failed(
        self,
        execution: Execution,
        held: HeldLease,
        callbacks: StoreCallbacks,
        executor: Executor,
        exc: Exception,
    ) -> Execution:
        """The executor refused or failed the launch: the executor phase ends failed, and so
        does the attempt (an ``OperationError`` with its own code and retry hint), unless it
        cannot tell what it started (``CannotTellError``): then the attempt is held."""
        callbacks.buffer_end("executor", PhaseOutcome.FAILED)
        await callbacks.flush()
        if isinstance(exc, LostSightError):
            # Its program died mid-launch: recovery, at the next epoch, finds what it started.
            return await self.release_for_recovery(execution, held, exc)
        if isinstance(exc, NotStartedError) and callbacks.recovery_persisted:
            # "Nothing started" from a launch whose recovery metadata the store acknowledged
            # (an executor program that died mid-launch and lost track): recovery decides.
            return await self.release_for_recovery(execution, held, exc)
        past_deadline = self.clock.now_ms() >= execution.snapshot.deadline_ms
        if isinstance(exc, NotStartedError) and past_deadline:
            # A program that died mid-launch started nothing, and the deadline passed
            # meanwhile: timed out, never launched again now (its retry runs it, once).
            return await self.settle_timeout(
                execution, held, verified=True,
                why="its executor lost the launch and its deadline passed; nothing started",
            )  # fmt: skip
        if isinstance(exc, CannotTellError):
            return await self._hold_untold(execution, held, exc)
        if isinstance(exc, OperationError):
            return await self._fail(
                execution, held, exc.code, exc.message, permanent=exc.permanent,
                hint=exc.retry_hint, executor=executor, error=exc,
            )  # fmt: skip
        return await self._fail(
            execution, held, "executor_error",
            f"executor {execution.snapshot.executor!r} failed to launch ({type(exc).__name__})",
            executor=executor, error=exc,
        )  # fmt: skip

    def execution_context(
        self,
        execution: Execution,
        callbacks: StoreCallbacks,
        *,
        inputs: Sequence[InputEvent] = (),
        env: dict[str, str] | None = None,
    ) -> ExecutionContext:
        """The context an executor gets for this attempt, as pinned by its snapshot."""
        snap = execution.snapshot
        return ExecutionContext(
            execution_id=execution.id,
            work_id=execution.work_id,
            attempt=execution.attempt,
            epoch=execution.epoch,
            scope=execution.scope,
            binding=snap.binding,
            executor=snap.executor,
            generation=snap.executor_generation,
            config=snap.binding_config,
            inputs=inputs,
            env=env,
            deadline_ms=snap.deadline_ms,
            recovery=execution.recovery,
            launch_intent=execution.launch_intent,
            state_dir=self.options.executor_state_dir(snap.executor),
            callbacks=callbacks,
        )

    async def run_attempt(self, claim: Claim) -> Execution:
        """Launch and observe a claimed attempt under its held lease, to its end."""
        with traced(claim.execution, "start") as trace:
            async with self.hold(claim.lease) as held:
                launched = await self.launch(claim, held)
                if isinstance(launched, Execution):
                    ended = launched
                else:
                    count_start(launched.execution, self.clock.now_ms(),
                                submitted_at_ms=claim.work.created_at_ms)  # fmt: skip
                    ended = await self.observe(launched)
            trace.ended(str(ended.status), failure_code=ended.failure_code, epoch=ended.epoch)
            return ended

    # --- observe and settle --------------------------------------------------------------------

    async def observe(self, attempt: Attempt) -> Execution:
        """Wait for the attempt outside storage, then apply its result under the lease.

        A quick attempt's launch trail goes with its settlement; a longer one's is written once
        it has run for ``QUICK_OBSERVE_S``, so its running state shows. The quick window and the
        deadline share one cancel scope: the common attempt, a quick one, enters one."""
        execution = attempt.execution
        remaining_s = max(execution.snapshot.deadline_ms - self.clock.now_ms(), 0) / 1000
        now = anyio.current_time()
        ends_at = now + remaining_s
        trail = attempt.callbacks
        quick_until = now + QUICK_OBSERVE_S if trail is not None and trail.has_pending else ends_at
        outcome = await self._wait(attempt, min(ends_at, quick_until))
        if outcome is None and quick_until < ends_at:
            outcome = await self._wait(attempt, ends_at, flush_first=True)
        if outcome is None and (remaining_s == 0 or self._overslept(execution)):
            outcome = await self._wait(attempt, anyio.current_time() + LATE_LOOK_S)
        if outcome is None:
            return await self.time_out(attempt)
        if not isinstance(outcome, _ObserveFailed):
            return await self.apply_result(
                execution, attempt.held, outcome, attempt.executor, attempt.callbacks
            )
        error = outcome.error
        if isinstance(error, (NotStartedError, LostSightError)):
            # The executor lost sight of the segment (its program died): recovery, at the next
            # epoch, asks what became of it (a "not started" here contradicts the acknowledged
            # recovery metadata: recovery holds it).
            if attempt.callbacks is not None and attempt.callbacks.has_pending:
                await attempt.callbacks.flush()
            return await self.release_for_recovery(execution, attempt.held, error)
        if isinstance(error, CannotTellError):
            return await self._hold_untold(execution, attempt.held, error, attempt.callbacks)
        if isinstance(error, OperationError):
            return await self._fail(
                execution, attempt.held, error.code,
                f"executor observation failed: {error.code}: {error.message}",
                permanent=error.permanent, hint=error.retry_hint, executor=attempt.executor,
                error=error, trail=attempt.callbacks,
            )  # fmt: skip
        log.warning(
            "observe failed execution=%s epoch=%s cause=%s",
            execution.id, execution.epoch, type(error).__name__,
        )  # fmt: skip
        return await self._fail(
            execution, attempt.held, "executor_error",
            f"executor observation failed ({type(error).__name__})",
            executor=attempt.executor, error=error, trail=attempt.callbacks,
        )  # fmt: skip

    def _overslept(self, execution: Execution) -> bool:
        """The deadline passed while this host could not look at the attempt."""
        return self.clock.now_ms() - execution.snapshot.deadline_ms >= LATE_SLACK_MS

    async def release_for_recovery(
        self, execution: Execution, held: HeldLease, error: OperationError
    ) -> Execution:
        """Hand the attempt to recovery at once: its lease is released (recovery claims it at the
        next epoch and asks the pinned generation what became of it). Returns it unfinished."""
        log.warning(
            "attempt handed to recovery execution=%s epoch=%s: [%s] %s",
            execution.id, execution.epoch, error.code, error.message,
        )  # fmt: skip
        async with held.ending_write():
            await self.store.release_lease(held.lease, now_ms=self.clock.now_ms())
        return execution

    async def _wait(
        self, attempt: Attempt, deadline: float, *, flush_first: bool = False
    ) -> Result | _ObserveFailed | None:
        """The attempt's result; ``None`` at ``deadline`` (loop time); the executor's error if
        observing it failed. ``flush_first``: write the buffered launch trail first."""
        with anyio.CancelScope(deadline=deadline):
            try:
                if flush_first and attempt.callbacks is not None:
                    await attempt.callbacks.flush()
                return await attempt.handle.wait()
            except (LeaseLostError, StoreError):
                # A store that cannot take the observation's writes says nothing about the job:
                # never fail the attempt for it. The host hands it to recovery (adopt, not rerun).
                raise
            except Exception as exc:
                return _ObserveFailed(exc)
        return None

    async def apply_result(
        self,
        execution: Execution,
        held: HeldLease,
        result: Result,
        executor: Executor,
        trail: StoreCallbacks | None = None,
    ) -> Execution:
        """Apply an executor's structured result in one fenced transition."""
        try:
            validate_result(result)
        except OperationError as exc:
            return await self._fail(
                execution, held, exc.code, exc.message, confirmed=True, executor=executor,
                trail=trail,
            )  # fmt: skip
        hint: RetryHint | None = None
        if result.outcome is OutcomeKind.FAILED:
            hint = result.retry_hint or self.plugins.retry_hint(
                execution.snapshot.executor, None, result
            )
        now = self.clock.now_ms()

        def decide(ex: Execution, work: Work) -> policy.Transition:
            if result.outcome is OutcomeKind.FAILED:
                return policy.failure(
                    ex, work, now_ms=now, code="failed",
                    message=result.summary or "the attempt failed", result=result,
                    permanent=result.permanent, hint=hint, exclusion_confirmed=True,
                )  # fmt: skip
            if result.outcome is OutcomeKind.WAITING:
                return policy.parking(ex, work, result, now)
            return policy.completion(ex, work, result, now)

        # Consumed input settles its inject intents, whatever their dispatch state, in the same
        # transaction: completion then sees only the input nobody has consumed.
        return await self._settle(held, decide, now, trail, consumed=result.consumed_inputs)

    async def time_out(self, attempt: Attempt) -> Execution:
        """The persisted deadline is due: stop the work, record the failure, keep the hold
        unless the stop was verified.

        Only under current lease authority: a host that lost it while it could not look (paused
        past its lease) stops nothing; recovery decides (``LeaseLostError``)."""
        held = attempt.held
        if held.lease.expires_at_ms <= self.clock.now_ms():
            raise LeaseLostError(
                f"attempt {held.lease.execution_id} epoch {held.lease.epoch}: its deadline is "
                "due, but so is its lease; recovery decides, nothing is stopped here"
            )
        verified, _ = await self.stop_verified(attempt.executor, attempt.context.stop_target())
        return await self.settle_timeout(
            attempt.execution, held, verified=verified, trail=attempt.callbacks
        )

    async def stop_verified(self, executor: Executor, target: StopTarget) -> tuple[bool, str]:
        """Stop through ``executor``: whether the stop was verified, and its detail."""
        try:
            evidence = await executor.stop(target)
        except Exception as exc:
            log.warning(
                "stop after timeout failed execution=%s epoch=%s cause=%s",
                target.execution_id, target.epoch, type(exc).__name__,
            )  # fmt: skip
            return False, f"the stop failed ({type(exc).__name__})"
        return evidence.verified, evidence.detail

    async def settle_timeout(
        self,
        execution: Execution,
        held: HeldLease,
        *,
        verified: bool,
        trail: StoreCallbacks | None = None,
        why: str = "",
    ) -> Execution:
        """Record the attempt ``timed_out`` (a counted failure); its resource hold stays unless
        the stop was ``verified``."""
        now = self.clock.now_ms()
        timeout = execution.snapshot.timeout_seconds
        message = f"timed out after {timeout:g} s" + (f" ({why})" if why else "")

        def decide(ex: Execution, work: Work) -> policy.Transition:
            return policy.failure(
                ex, work, now_ms=now, code="timeout", message=message,
                status=ExecutionStatus.TIMED_OUT, exclusion_confirmed=verified,
            )  # fmt: skip

        return await self._settle(held, decide, now, trail)

    async def hold_recovery(
        self,
        execution: Execution,
        held: HeldLease,
        code: str,
        message: str,
        how: str,
        trail: StoreCallbacks | None = None,
    ) -> Execution:
        """Fail closed without failing: keep the attempt unfinished, its slot and its Work
        blocked, and try recovery again after ``recovery_retry_ms`` (or at once after a start or
        reload)."""
        if trail is not None and trail.has_pending:
            await trail.flush()
        now = self.clock.now_ms()
        before = execution.recovery_hold
        # Tried again at the deadline at the latest: a held attempt's deadline is enforced.
        retry_at = now + self.options.recovery_retry_ms
        if now < execution.snapshot.deadline_ms < retry_at:
            retry_at = execution.snapshot.deadline_ms
        settle = (
            f"{how}; or, once you know it no longer runs: conduit work confirm-stopped "
            f"{execution.work_id} --epoch {execution.epoch}"
        )
        recovery_hold = RecoveryHold(
            code=code,
            message=message,
            epoch=execution.epoch,
            since_ms=before.since_ms if before is not None else now,
            retry_at_ms=retry_at,
            tries=before.tries + 1 if before is not None else 1,
            settle=settle,
        )
        level = logging.ERROR if before is None else logging.INFO
        log.log(
            level, "recovery held execution=%s epoch=%s try=%d: [%s] %s",
            execution.id, execution.epoch, recovery_hold.tries, code, message,
        )  # fmt: skip
        async with held.ending_write():
            return await self.store.hold_recovery(held.lease, recovery_hold, now_ms=now)

    async def _hold_untold(
        self,
        execution: Execution,
        held: HeldLease,
        error: CannotTellError,
        trail: StoreCallbacks | None = None,
    ) -> Execution:
        # The executor lost sight of the job and cannot tell what runs: held, never retried.
        return await self.hold_recovery(
            execution, held, error.code,
            f"recovery could not tell what runs: {error.code}: {error.message}",
            f"the executor {execution.snapshot.executor!r} is asked again; see its logs",
            trail=trail,
        )  # fmt: skip

    async def fail_attempt(
        self,
        execution: Execution,
        held: HeldLease,
        code: str,
        message: str,
        *,
        confirmed: bool = False,
    ) -> Execution:
        """Record a counted failure; the resource hold stays unless ``confirmed`` (the
        resources are proven gone)."""
        return await self._fail(execution, held, code, message, confirmed=confirmed)

    async def _settle(
        self,
        held: HeldLease,
        decide: Callable[[Execution, Work], policy.Transition],
        now: int,
        trail: StoreCallbacks | None,
        *,
        consumed: Sequence[str] = (),
    ) -> Execution:
        """Settle in one fenced transaction, with any launch trail still buffered."""
        also = trail.take_pending() if trail is not None and trail.has_pending else None
        if also is not None:
            first = decide

            def decide(ex: Execution, work: Work) -> policy.Transition:
                return dataclasses.replace(first(ex, work), also=also)

        if self.on_settling is not None:
            try:
                self.on_settling()
            except Exception:  # a host's listener never keeps an attempt from settling
                log.exception("settling listener failed execution=%s", held.lease.execution_id)
        async with held.ending_write():
            settled = await self.store.settle_attempt(
                held.lease, decide, now_ms=now, consumed=consumed
            )
        count_end(settled)
        return settled

    async def _fail(
        self,
        execution: Execution,
        held: HeldLease,
        code: str,
        message: str,
        *,
        permanent: bool = False,
        hint: RetryHint | None = None,
        confirmed: bool = False,
        executor: Executor | None = None,
        error: BaseException | None = None,
        trail: StoreCallbacks | None = None,
    ) -> Execution:
        if hint is None and executor is not None:
            hint = self.plugins.retry_hint(execution.snapshot.executor, error, None)
        now = self.clock.now_ms()

        def decide(ex: Execution, work: Work) -> policy.Transition:
            return policy.failure(
                ex, work, now_ms=now, code=code, message=message,
                permanent=permanent, hint=hint, exclusion_confirmed=confirmed,
            )  # fmt: skip

        return await self._settle(held, decide, now, trail)
