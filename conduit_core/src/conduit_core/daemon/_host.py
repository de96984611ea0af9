"""The host loop: one pass at a time drives the scheduler; every attempt runs in its own task.

A pass fires due timers, recovers expired attempts, claims ready Work, runs the stop/confirm
pass and dispatches controls. Nothing that waits on an executor runs on the pass itself
(invariant 12): launches and observations run in a task per attempt, and stops and controls in
a task per attempt or intent with its own deadline (:class:`ExecutorCalls`), so one stuck
executor never blocks the next pass. Passes are woken by writes (:class:`Waker`) and by a
periodic rescan.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio
from anyio.abc import TaskGroup, TaskStatus

from conduit_core.daemon._offpass import ExecutorCalls
from conduit_core.daemon._outage import StoreOutage, is_outage
from conduit_core.daemon._wake import Waker
from conduit_core.errors import ConduitError, LeaseLostError
from conduit_core.model import ControlIntent, ExecutionStatus, Lease
from conduit_core.runtime import Scheduler, TaskPool
from conduit_core.storage import Claim

__all__ = ["HostLoop", "PassStep"]

log = logging.getLogger("conduit.daemon")

AttemptKind = Literal["start", "recover", "resume"]
#: How many recovery batches one pass claims at most (``recover_batch`` each).
RECOVER_BATCHES_PER_PASS = 20
#: An extra step of every pass (the Routines ticker plugs in here): gets the current scheduler.
PassStep = Callable[[Scheduler], Awaitable[object]]


@dataclass
class _Running:
    lease: Lease
    kind: AttemptKind
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class HostLoop:
    """Drives one :class:`Scheduler` (replaced on reload; live attempts keep their own)."""

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        rescan_s: float = 1.0,
        claim_batch: int = 64,
        recover_batch: int = 1000,
        waker: Waker | None = None,
        on_wake: Callable[[], None] | None = None,
        on_ready: Callable[[], None] | None = None,
        outage: StoreOutage | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.rescan_s = rescan_s
        self.claim_batch = claim_batch
        self.recover_batch = recover_batch
        self.waker = waker or Waker()
        self.stopping = False
        #: Set by :meth:`drain`: no new claims or recoveries; stops once nothing runs here.
        self.draining = False
        self.passes = 0
        self.running: dict[str, _Running] = {}
        #: Tell other daemons of a write: one that needs their pass, one that made Work ready
        #: or freed a slot (``on_ready``; ``on_wake`` without it).
        self._on_wake = on_wake
        self._on_ready = on_ready or on_wake
        self._steps: list[tuple[str, PassStep]] = []
        self._attempt_listeners: list[Callable[[Claim], None]] = []
        #: Runs the attempts and the claims settlements trigger (tasks reused, see TaskPool).
        self._tasks: TaskPool | None = None
        self._keepers: TaskGroup | None = None
        self._idle = anyio.Event()
        self.outage = outage or StoreOutage()
        # Leases of attempts whose observation a store outage interrupted: released once the
        # store answers again, so recovery adopts them at once instead of after their expiry.
        self._interrupted: dict[str, Lease] = {}
        # Held recoveries are tried at once after a start or reload (the pinned generation may
        # be back), not only after their backoff.
        self._retry_held = True
        # Set while a claim started off the pass (by a settlement, or an attempt's end) is
        # under way (one at a time); ``_claim_again``: a slot was freed meanwhile, claim again.
        self._claiming_off_pass = False
        self._claim_again = False
        scheduler.set_settling_listener(self._claim_with_settlement)
        #: Stops and controls, each in a task of its own with its own deadline.
        self.calls = ExecutorCalls()

    # --- HostHooks (what the API sees) -------------------------------------------------------

    def wake(self) -> None:
        self.waker.poke()
        if self._on_wake is not None:
            self._on_wake()

    def work_ready(self) -> None:
        """Work was created ready to start, or an attempt completed and freed its slot: claim
        now, without a whole pass (one would read timers, expiries, stops and controls that
        neither changed); other daemons sharing the store are told, to claim as well."""
        if self._on_ready is not None:
            self._on_ready()  # other daemons may have the free slot (capacity is shared)
        self.claim_soon()

    def claim_soon(self) -> None:
        """Claim now, without a whole pass (another daemon made Work ready or freed a slot).
        While the store is down a pass is woken instead: passes are what find it back (and
        release the leases the outage interrupted), and a write that went through says it may
        be."""
        if self.outage.down:
            self.waker.poke()
            return
        if self._claiming_off_pass:
            self._claim_again = True  # the claim under way may have read before this
            return
        self._claim_off_pass()

    def run_resumed(self, claims: list[Claim]) -> None:
        for claim in claims:
            self._spawn(claim, "resume")

    def forget(self, execution_ids: list[str]) -> None:
        for execution_id in execution_ids:
            running = self.running.get(execution_id)
            if running is not None:
                running.scope.cancel()

    def running_count(self) -> int:
        return len(self.running)

    #: Ended attempts are stopped by the passes, so the API need not wait on an executor.
    stops_ended_attempts = True

    def stop_state(self, execution_id: str) -> str | None:
        return self.calls.state(_stop_key(execution_id))

    # --- extension -----------------------------------------------------------------------------

    def add_attempt_listener(self, listener: Callable[[Claim], None]) -> None:
        """Call ``listener(claim)`` as soon as an attempt this host ran has ended and its outcome
        is written (the Routines ticker settles a fired Work at once this way)."""
        self._attempt_listeners.append(listener)

    def add_step(self, name: str, step: PassStep) -> None:
        """Run ``step`` at the end of every pass (errors are logged, never fatal)."""
        self._steps.append((name, step))

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pass, wait for a wake or the rescan, repeat; returns after :meth:`stop`."""
        async with anyio.create_task_group() as keepers:
            self._keepers = keepers
            await keepers.start(self._keep_leases, self.scheduler)
            async with self.calls.running(), anyio.create_task_group() as tg:
                self._tasks = TaskPool(tg)
                task_status.started()
                while not self.stopping:
                    await self.run_pass()
                    if self.draining and not self.running:
                        log.info("drained: no attempt runs here any more; stopping")
                        self.stop()
                        break
                    await self.waker.wait(self.outage.pause_s(await self._sleep_s()))
                await self._release_running()
                self._tasks.close()  # the pool's idle tasks end; the group's wait is for the busy
            keepers.cancel_scope.cancel()

    async def _sleep_s(self) -> float:
        """Until the next pass: the rescan, or sooner when a timer falls due before it."""
        if self.outage.down:
            return self.rescan_s
        try:
            due = await self.scheduler.store.next_timer_due()
        except ConduitError:
            return self.rescan_s
        if due is None:
            return self.rescan_s
        until = (due - self.scheduler.clock.now_ms()) / 1000
        return min(self.rescan_s, max(until, 0.0))

    async def _keep_leases(
        self, sched: Scheduler, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # One lease keeper per scheduler, kept until the loop ends: attempts started before a
        # reload are still held by the scheduler (and keeper) they started with.
        async with sched.keeping_leases():
            task_status.started()
            await anyio.sleep_forever()

    async def replace_scheduler(self, sched: Scheduler) -> None:
        """Use ``sched`` for new passes and attempts (a reload); live attempts keep theirs."""
        if self._keepers is not None:
            await self._keepers.start(self._keep_leases, sched)
        sched.set_settling_listener(self._claim_with_settlement)
        self.scheduler = sched
        self._retry_held = True
        self.wake()

    async def run_pass(self) -> None:
        """One pass; while the store is unreachable the rest of the pass is skipped (every step
        would fail the same way) and the outage is reported once, not once per step."""
        sched = self.scheduler
        self.passes += 1
        steps: list[tuple[str, Callable[[Scheduler], Awaitable[object]]]] = [
            ("release interrupted", self._release_interrupted),
            ("fire timers", self._fire_timers),
        ]
        if not self.stopping and not self.draining:
            steps += [("recover", self._recover), ("claim", self._claim)]
        steps += [
            ("confirm stops", self._confirm),
            ("dispatch controls", self._dispatch),
            ("settle budgets", self._settle_budgets),
            *self._steps,
        ]
        for name, step in steps:
            if not await self._step(name, step, sched):
                return
        self.outage.recovered()

    async def _step(
        self, name: str, step: Callable[[Scheduler], Awaitable[object]], sched: Scheduler
    ) -> bool:
        """Run one step; False when the store did not answer (the pass stops there)."""
        try:
            await step(sched)
        except ConduitError as exc:
            if is_outage(exc):
                self.outage.failed(f"pass step {name!r}", exc)
                return False
            log.warning("pass step %r failed: [%s] %s", name, exc.code, exc.message)
        except Exception:
            log.exception("pass step %r failed", name)
        return True

    async def _release_interrupted(self, sched: Scheduler) -> None:
        for execution_id, lease in list(self._interrupted.items()):
            try:
                await sched.store.release_lease(lease, now_ms=sched.clock.now_ms())
            except LeaseLostError:
                pass  # expired and recovered elsewhere meanwhile: nothing to hand over
            except ConduitError as exc:
                if is_outage(exc):
                    raise  # still down: keep it for the next pass
                # Anything else is final for this lease: recovery takes it at its expiry.
                log.warning(
                    "lease release after a store outage failed execution=%s epoch=%s: [%s] %s",
                    execution_id, lease.epoch, exc.code, exc.message,
                )  # fmt: skip
            else:
                log.info("lease released after a store outage execution=%s epoch=%s",
                         execution_id, lease.epoch)  # fmt: skip
            del self._interrupted[execution_id]

    async def _fire_timers(self, sched: Scheduler) -> None:
        fired = await sched.fire_due_timers()
        if fired:
            log.info("timers fired: %d", len(fired))

    async def _recover(self, sched: Scheduler) -> None:
        if self._retry_held:
            held = await sched.retry_held_recoveries()
            self._retry_held = False  # only once that read and claim went through
            for claim in held:
                self._spawn(claim, "recover")
        # Batch after batch while batches come back full: a restart after a crash recovers a
        # thousand attempts in this one pass, not one batch per rescan. Bounded, so a pass
        # still reaches its other steps.
        for _ in range(RECOVER_BATCHES_PER_PASS):
            claims = await sched.recover_expired(self.recover_batch)
            for claim in claims:
                self._spawn(claim, "recover")
            if len(claims) < self.recover_batch:
                break

    async def _claim(self, sched: Scheduler) -> None:
        # At most ``claim_batch``, and no more than the slots free now: the store reads only
        # the ready Work there is room for. What waits, and for which limit, the API reads
        # from the store when asked (``Store.capacity_waiting``), not from refused claims.
        claims, _ = await sched.claim_ready(self.claim_batch)
        for claim in claims:
            self._spawn(claim, "start")

    def _claim_with_settlement(self) -> None:
        """An attempt's settlement is being sent: claim now, outside the pass, so the claim
        joins the settlement's group-commit batch and takes the slot it frees (one transaction,
        not a settlement and then a pass's claim). The pass the attempt's end wakes still runs.
        """
        if self._claiming_off_pass:
            return  # the claim under way takes every slot its batch frees
        self._claim_off_pass()

    def _claim_off_pass(self) -> None:
        if self.stopping or self.draining or self.outage.down or self._tasks is None:
            return
        self._claiming_off_pass = True
        self._tasks.start_soon(self._claim_now, self.scheduler)

    async def _claim_now(self, sched: Scheduler) -> None:
        try:
            while True:
                self._claim_again = False
                answered = await self._step("claim", self._claim, sched)
                if not answered or not self._claim_again or self.stopping or self.draining:
                    break  # (the store did not answer: the passes take over from the outage)
        finally:
            self._claiming_off_pass = False

    async def _confirm(self, sched: Scheduler) -> None:
        keys = []
        for ex in await sched.due_stops():
            keys.append(_stop_key(ex.id))
            self._stop_soon(sched, ex.id, ex.epoch, ex.snapshot.executor)
        self.calls.keep_only("stop:", keys)

    def _stop_soon(self, sched: Scheduler, execution_id: str, epoch: int, executor: str) -> None:
        """Stop and confirm the attempt in a task of its own (one at a time per attempt)."""

        async def stop() -> str | None:
            reason = await sched.try_stop(execution_id)
            if reason is None:
                log.info("stop confirmed execution=%s epoch=%s", execution_id, epoch,
                         extra={"execution_id": execution_id, "epoch": epoch})  # fmt: skip
            return reason

        self.calls.start(
            _stop_key(execution_id),
            f"stop execution={execution_id} epoch={epoch} executor={executor}",
            stop,
            deadline_s=sched.options.executor_call_timeout_ms / 1000,
        )

    async def _dispatch(self, sched: Scheduler) -> None:
        intents = await sched.open_controls()
        for intent in intents:
            self._dispatch_soon(sched, intent)
        self.calls.keep_only("control:", [f"control:{intent.id}" for intent in intents])

    def _dispatch_soon(self, sched: Scheduler, intent: ControlIntent) -> None:
        """Dispatch the intent in a task of its own (one at a time per intent)."""

        async def dispatch() -> str | None:
            if await sched.dispatch_control(intent):
                log.info("control settled id=%s execution=%s", intent.id, intent.execution_id)
            return None  # settled, or waiting for its attempt's launch: the next pass looks

        self.calls.start(
            f"control:{intent.id}",
            f"{intent.kind} id={intent.id} execution={intent.execution_id}",
            dispatch,
            deadline_s=sched.options.executor_call_timeout_ms / 1000,
        )

    async def _settle_budgets(self, sched: Scheduler) -> None:
        settled = await sched.settle_budgets()
        if settled:
            log.info("budget usage settled: %d", settled)

    # --- attempts ------------------------------------------------------------------------------

    def _spawn(self, claim: Claim, kind: AttemptKind) -> None:
        if self._tasks is None:
            raise RuntimeError("the host loop is not running")
        running = _Running(lease=claim.lease, kind=kind)
        self.running[claim.execution.id] = running
        self._tasks.start_soon(self._run_attempt, self.scheduler, claim, running)

    async def _run_attempt(self, sched: Scheduler, claim: Claim, running: _Running) -> None:
        ex = claim.execution
        ids = {"execution_id": ex.id, "epoch": ex.epoch, "work_id": ex.work_id}
        completed = False  # completed with its exclusion confirmed: only its slot to refill
        log.info(
            "attempt %s execution=%s epoch=%s work=%s attempt=%d executor=%s",
            running.kind, ex.id, ex.epoch, ex.work_id, ex.attempt, ex.snapshot.executor,
            extra=ids,
        )  # fmt: skip
        try:
            with running.scope:
                if running.kind == "start":
                    ended = await sched.run_attempt(claim)
                elif running.kind == "recover":
                    ended = await sched.run_recovery(claim)
                else:
                    ended = await sched.run_resumed(claim)
                log.info(
                    "attempt ended execution=%s epoch=%s work=%s status=%s%s",
                    ended.id, ended.epoch, ended.work_id, ended.status,
                    f" code={ended.failure_code}" if ended.failure_code else "",
                    extra={**ids, "epoch": ended.epoch},
                )  # fmt: skip
                completed = (
                    ended.status is ExecutionStatus.COMPLETED and ended.exclusion_confirmed
                )
            if running.scope.cancelled_caught and not self.stopping:
                # Only a cancel (``forget``) cancels an attempt's scope while not stopping.
                log.info("attempt cancelled execution=%s epoch=%s: its Work was cancelled; "
                         "observing it ended", ex.id, ex.epoch, extra=ids)  # fmt: skip
        except LeaseLostError as exc:
            cancelled_by = await self._cancelled_by(sched, claim.lease)
            if cancelled_by is not None:
                # An operator's cancel or interrupt ended the lease on purpose: no loss.
                log.info("attempt cancelled execution=%s epoch=%s: %s; observing it ended",
                         ex.id, claim.lease.epoch, cancelled_by, extra=ids)  # fmt: skip
            else:
                log.warning("attempt lost its lease execution=%s epoch=%s: %s", ex.id, ex.epoch,
                            exc.message, extra=ids)  # fmt: skip
            if not self.stopping:
                await self._after_lost_lease(sched, claim)
        except ConduitError as exc:
            if is_outage(exc) and not self.stopping:
                # The job may well have ended: its result is recorded by recovery (adopting it,
                # never running it again) once the store answers and the lease is released.
                self.outage.failed(f"attempt {ex.id}", exc)
                log.info("attempt observation interrupted by the store outage execution=%s "
                         "epoch=%s; recovery adopts it when the store answers", ex.id, ex.epoch,
                         extra=ids)  # fmt: skip
                self._interrupted[ex.id] = claim.lease
            else:
                log.error("attempt failed in the host execution=%s epoch=%s: [%s] %s",
                          ex.id, ex.epoch, exc.code, exc.message, extra=ids)  # fmt: skip
        except Exception:
            log.exception("attempt crashed in the host execution=%s epoch=%s", ex.id, ex.epoch,
                          extra=ids)  # fmt: skip
        finally:
            self.running.pop(ex.id, None)
            if not self.running:
                self._idle.set()
            if not self.stopping:
                if completed and not self.draining and not running.scope.cancelled_caught:
                    # Claim for the slot (here and on other daemons). Its settlement's claim
                    # has usually taken it already; nothing is left to stop or time.
                    self.work_ready()
                else:
                    self.wake()  # a pass: a stop, a retry timer or a drain's end may follow
                for listener in self._attempt_listeners:
                    try:
                        listener(claim)
                    except Exception:  # a listener never takes the host down
                        log.exception("attempt listener failed execution=%s", ex.id, extra=ids)

    @staticmethod
    async def _cancelled_by(sched: Scheduler, lease: Lease) -> str | None:
        """Why the attempt of ``lease`` ended, when a cancel or an interrupt ended it (the store
        says so, whichever daemon or CLI did it); ``None`` for a real loss of the lease."""
        try:
            current = await sched.store.get_execution(lease.execution_id)
        except ConduitError:
            return None  # cannot tell (an outage): say what the host saw, a lost lease
        if current.epoch != lease.epoch or current.status is not ExecutionStatus.CANCELLED:
            return None
        if current.failure_code == "interrupted":
            return "interrupted by an operator"
        return "its Work was cancelled"

    async def _after_lost_lease(self, sched: Scheduler, claim: Claim) -> None:
        """Stop and confirm only when recovery no longer owns the attempt (off this task: the
        stop has its own deadline, and the attempt's slot in ``running`` is freed now)."""
        lease = claim.lease
        try:
            if await sched.needs_stop_after(lease):
                self._stop_soon(sched, lease.execution_id, lease.epoch,
                                claim.execution.snapshot.executor)  # fmt: skip
        except ConduitError as exc:
            log.warning("stop after lost lease failed execution=%s epoch=%s: %s",
                        lease.execution_id, lease.epoch, exc.message)  # fmt: skip

    # --- drain and graceful stop ---------------------------------------------------------------

    def drain(self) -> None:
        """Claim and recover nothing new; let the attempts running here finish (their leases
        renewed as ever), then stop (the loop returns; a daemon exits 0). Idempotent."""
        if self.draining or self.stopping:
            return
        self.draining = True
        log.info("draining: no new claims; %d running attempt(s) finish first",
                 len(self.running))  # fmt: skip
        self.waker.poke()

    def stop(self) -> None:
        """Stop claiming; the loop then releases the leases of running attempts and returns."""
        self.stopping = True
        self.waker.poke()

    async def _release_running(self) -> None:
        """Stop observing every attempt and release its lease so recovery adopts it later.

        Detached jobs keep running; cancelling observation never stops them.
        """
        held = [(eid, r.lease) for eid, r in self.running.items()]
        if not held:
            return
        self._idle = anyio.Event()
        for running in self.running.values():
            running.scope.cancel()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(10):
                while self.running:
                    await self._idle.wait()
                    if self.running:
                        self._idle = anyio.Event()
            now = self.scheduler.clock.now_ms()
            for execution_id, lease in held:
                try:
                    await self.scheduler.store.release_lease(lease, now_ms=now)
                    log.info(
                        "lease released execution=%s epoch=%s", execution_id, lease.epoch,
                        extra={"execution_id": execution_id, "epoch": lease.epoch},
                    )  # fmt: skip
                except LeaseLostError:
                    pass  # it ended (or was taken over) meanwhile: nothing to hand over
                except ConduitError as exc:
                    log.warning("lease release failed execution=%s epoch=%s: %s",
                                execution_id, lease.epoch, exc.message)  # fmt: skip


def _stop_key(execution_id: str) -> str:
    return f"stop:{execution_id}"
