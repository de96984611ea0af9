"""The scheduler: the façade a host drives, assembled from parts with one job each.

``AttemptRunner`` (_attempts) pins, launches, observes and settles attempts under their leases;
``Admission`` (_admission) asks start gates and budgets; ``Recovery`` (_recovery) relaunches,
adopts or holds attempts that lost their holder; ``Wakes`` (_wakes) fires timers and wakes
parked attempts; ``Controls`` (_controls) dispatches inject/interrupt and cancels; ``Stops``
(_stops) stops and confirms. Each gets the state it needs, never the Scheduler back, so the
imports inside runtime/ point one way (tests/core/test_layers.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import AttemptSnapshot, ControlIntent, Event, Execution, Lease, Work
from conduit_core.plugins import Plugins
from conduit_core.runtime._admission import Admission
from conduit_core.runtime._attempts import Attempt, AttemptRunner
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._controls import Controls
from conduit_core.runtime._counting import traced
from conduit_core.runtime._holder import HeldLease
from conduit_core.runtime._inputs import INPUT_EVENT_TYPE
from conduit_core.runtime._options import SchedulerOptions
from conduit_core.runtime._recovery import Recovery
from conduit_core.runtime._stops import Stops
from conduit_core.runtime._wakes import Wakes
from conduit_core.storage import (
    CapacityLimits,
    Claim,
    ClaimRefusal,
    ClaimRequest,
    DedupScope,
    Store,
    SubmitKey,
    Submitted,
)
from conduit_core.validation import (
    ID_MAX_LENGTH,
    InvalidValueError,
    check_payload,
    check_work_id,
    render_concurrency_key,
)

__all__ = ["Attempt", "Scheduler"]

log = logging.getLogger("conduit.runtime")


class Scheduler:
    """``Scheduler(store, clock, plugins, options)``; options are copied at construction."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        plugins: Plugins,
        options: SchedulerOptions | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.plugins = plugins
        # Copied, so a caller changing theirs cannot change a running scheduler.
        options = options or SchedulerOptions()
        self.options = dataclasses.replace(options, binding_pools=_binding_pools(options, plugins))
        opts = self.options
        self.runner = AttemptRunner(store, clock, plugins, opts)
        self.admission = Admission(store, clock, plugins, opts, self.runner.pin)
        self.stops = Stops(store, clock, plugins, opts.executor_state_dir)
        self.recovery = Recovery(store, clock, plugins, opts, self.runner)
        self.wakes = Wakes(store, clock, opts, self.runner)
        self.controls = Controls(store, clock, plugins, self.stops)

    def capacity(self) -> CapacityLimits:
        """The limits claims are checked against, with the pool of each binding's executor."""
        return self.options.capacity()

    # --- pinning -------------------------------------------------------------------------------

    def snapshot_for(self, work: Work) -> AttemptSnapshot:
        """Pin everything the attempt will run with, from the current bindings and manifests."""
        return self.runner.pin(work)

    # --- claim, launch, start ------------------------------------------------------------------

    async def claim(self, work_id: str) -> Claim:
        """Claim the next attempt of one Work (raises the refusal as an error)."""
        if self.admission.active():  # start gates or budgets: see _admission
            return await self.admission.claim(work_id)
        work = await self.store.get_work(work_id)
        return await self.store.claim_attempt(
            ClaimRequest(
                work_id=work_id,
                snapshot=self.snapshot_for(work),
                max_inputs=self.options.max_inputs,
            ),
            owner=self.options.owner,
            now_ms=self.clock.now_ms(),
            lease_ms=self.options.lease_ms,
            capacity=self.options.capacity(),
        )

    async def claim_ready(self, limit: int) -> tuple[list[Claim], list[ClaimRefusal]]:
        """Claim up to ``limit`` ready Work in one transaction; refusals are returned."""
        if self.admission.active():
            return await self.admission.claim_ready(limit)

        def snapshot_for(work: Work) -> AttemptSnapshot | None:
            try:
                return self.snapshot_for(work)
            except ConduitError as exc:
                log.warning("work %s cannot be pinned: %s", work.id, exc)
                return None

        outcomes = await self.store.claim_ready(
            limit=limit,
            snapshot_for=snapshot_for,
            owner=self.options.owner,
            now_ms=self.clock.now_ms(),
            lease_ms=self.options.lease_ms,
            capacity=self.options.capacity(),
        )
        claims = [o for o in outcomes if isinstance(o, Claim)]
        refusals = [o for o in outcomes if isinstance(o, ClaimRefusal)]
        return claims, refusals

    def set_settling_listener(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener()`` as each attempt's settlement is sent to the store, before it
        commits (``None``: stop calling it).

        A host that claims from the listener, in the same turn of the event loop (start the
        claiming task from it), sends its claim with the settlement: a claim from the ready
        queue runs after the other writes of its group-commit batch, so it takes the slots the
        batch's settlements free, one transaction instead of two. The listener must not block.
        """
        self.runner.on_settling = listener

    def hold(self, lease: Lease) -> AbstractAsyncContextManager[HeldLease]:
        """Renew ``lease`` every third of its duration while the body runs (see
        :meth:`AttemptRunner.hold`)."""
        return self.runner.hold(lease)

    @asynccontextmanager
    async def keeping_leases(self) -> AsyncIterator[None]:
        """Run one lease keeper for every attempt this scheduler holds (hosts use this)."""
        async with self.runner.keeping_leases():
            yield

    async def launch(
        self, claim: Claim, held: HeldLease | None = None, *, wake: Event | None = None
    ) -> Attempt | Execution:
        """Launch a claimed attempt outside storage; returns the Attempt, or the failed Execution.

        Without ``held`` the lease is not renewed (a host that holds it elsewhere passes its own).
        """
        return await self.runner.launch(claim, held, wake=wake)

    async def start(self, work_id: str) -> Attempt | Execution:
        """Claim and launch (the lease is not held: see :meth:`run_attempt` for that)."""
        return await self.launch(await self.claim(work_id))

    async def run_attempt(self, claim: Claim) -> Execution:
        """Launch and observe a claimed attempt under its held lease, to its end."""
        return await self.runner.run_attempt(claim)

    # --- observe and settle --------------------------------------------------------------------

    async def observe(self, attempt: Attempt) -> Execution:
        """Wait for the attempt outside storage, then apply its result under the lease."""
        return await self.runner.observe(attempt)

    # --- recovery and physical stops (see _recovery, _stops) ----------------------------------

    async def recover_expired(self, limit: int = 100) -> list[Claim]:
        """Claim recovery (epoch + 1) of attempts whose lease expired or was released."""
        return await self.recovery.claim_expired(limit)

    async def take_over(self, owner: str) -> int:
        """Release every lease of ``owner``, known dead, so its attempts are recovered now."""
        return await self.recovery.take_over(owner)

    async def retry_held_recoveries(self) -> list[Claim]:
        """Claim every held recovery now, before its backoff (after a start or a reload)."""
        return await self.recovery.claim_held()

    async def run_recovery(self, claim: Claim) -> Execution:
        """Relaunch (nothing can be running), adopt, or hold a recovery claim, and observe it.

        A held recovery returns the attempt unfinished (``recovery_hold`` says why)."""
        with traced(claim.execution, "recover") as trace:
            ended = await self.recovery.run(claim)
            status = "held" if ended.recovery_hold is not None else str(ended.status)
            trace.ended(status, failure_code=ended.failure_code, epoch=ended.epoch)
            return ended

    async def confirm_stopped(
        self, work_id: str, epoch: int, *, by: str, reason: str = "", actor: str | None = None
    ) -> Execution:
        """A person confirms that the Work's held (or ended, unconfirmed) attempt no longer
        runs, for ``epoch``; audited as ``core.execution.stop_confirmed``.

        A held attempt ends failed (``stop_confirmed``, counted per its retry policy) with its
        exclusion confirmed, so the Work may start again.
        """
        return await self.recovery.confirm_stopped_by(
            work_id, epoch, by=by, reason=reason, actor=actor
        )

    async def stop_and_confirm(self, execution_id: str) -> bool:
        """Stop the attempt's resources; confirm its exclusion when the stop is verified."""
        return await self.stops.stop_and_confirm(execution_id)

    async def confirm_unexcluded(self) -> int:
        """The stop/confirm pass over ended attempts whose exclusion is unconfirmed."""
        return await self.stops.confirm_unexcluded()

    async def handle_lost_lease(self, lease: Lease) -> bool:
        """After lost authority: stop and confirm only when recovery no longer owns it."""
        return await self.stops.handle_lost_lease(lease)

    async def due_stops(self) -> list[Execution]:
        """Ended attempts whose exclusion is unconfirmed (a host stops each on its own)."""
        return await self.stops.due()

    async def try_stop(self, execution_id: str) -> str | None:
        """Stop and confirm one attempt: ``None`` when nothing is left to do, else why not."""
        return await self.stops.try_stop(execution_id)

    async def needs_stop_after(self, lease: Lease) -> bool:
        """After lost authority: whether recovery no longer owns the attempt (stop it then)."""
        return await self.stops.needs_stop_after(lease)

    # --- controls (see _controls) ---------------------------------------------------------------

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
        """Queue input; when a running attempt takes input, also an inject intent for it.
        ``actor`` (here and below): the named token that asked, kept on what is written."""
        return await self.controls.inject(
            work_id, payload, delivery_id=delivery_id, event_type=event_type,
            correlation_key=correlation_key, actor=actor,
        )  # fmt: skip

    async def interrupt(self, work_id: str, *, actor: str | None = None) -> ControlIntent:
        """Fence the running attempt, leave the Work ready, queue the interrupt."""
        return await self.controls.interrupt(work_id, actor=actor)

    async def cancel_work(
        self, work_id: str, *, stop: bool = True, actor: str | None = None
    ) -> Work:
        """Cancel the Work atomically, then stop and confirm whatever its attempts started
        (``stop=False``: a host's stop/confirm pass does that, see ``Controls.cancel_work``)."""
        return await self.controls.cancel_work(work_id, stop=stop, actor=actor)

    async def dispatch_controls(self, *, limit: int = 100) -> int:
        """Dispatch open inject/interrupt intents; returns how many were settled."""
        return await self.controls.dispatch_controls(limit=limit)

    async def open_controls(self, *, limit: int = 100) -> list[ControlIntent]:
        """Open inject/interrupt intents, oldest first (a host dispatches each on its own)."""
        return await self.store.open_controls(limit=limit)

    async def dispatch_control(self, intent: ControlIntent) -> int:
        """Dispatch one open intent; 1 when it was settled."""
        return await self.controls.dispatch(intent)

    # --- budgets and gates (see _admission, _budgets) -----------------------------------------

    async def settle_budgets(self) -> int:
        """Charge staged usage to the budget ledgers (the daemon runs this every pass)."""
        return await self.store.settle_budgets(
            self.admission.budget_book(), now_ms=self.clock.now_ms()
        )

    async def release_hold(
        self, work_id: str, *, reason: str = "", actor: str | None = None
    ) -> Work:
        """Release a budget hold, leaving one pass; a gate's hold is refused (``gate_hold``)."""
        return await self.store.release_budget_hold(
            work_id, reason=reason, now_ms=self.clock.now_ms(), actor=actor
        )

    async def settle_gate_hold(
        self, work_id: str, gate: str, *, admit: bool, reason: str = "", actor: str | None = None
    ) -> Work:
        """Only the holding gate registration settles its hold: admit leaves a pass (the next
        start skips the gates once), refuse cancels the Work. Idempotent."""
        return await self.store.settle_gate_hold(
            work_id, gate, admit=admit, reason=reason, now_ms=self.clock.now_ms(), actor=actor
        )

    # --- input, timers, retry ------------------------------------------------------------------

    async def submit(self, work: Work, first_input: Event | None = None) -> Work:
        """Create Work with its first input (the binding must exist). Every door (HTTP, CLI
        direct mode, Routines) comes through here, so the id grammar is enforced here."""
        work = self._check_submit(work, first_input)
        return await self.store.create_work(work, first_input=first_input)

    async def submit_keyed(
        self, work: Work, key: SubmitKey, first_input: Event | None = None
    ) -> Submitted:
        """:meth:`submit` under a dedup or debounce key: the created Work, or the Work already
        holding the key (``deduplicated``). Exactly one of racing submitters creates it."""
        self._check_submit(work, first_input)
        _check_submit_key(key)
        return await self.store.submit_keyed(
            work, key, first_input=first_input, now_ms=self.clock.now_ms()
        )

    async def submit_many(
        self, items: Sequence[tuple[Work, Event | None]]
    ) -> list[Work | ConduitError]:
        """:meth:`submit` for each ``(work, first_input)`` in one store write (a Routine claim
        pass fires many at once). Each result is the created Work or the error that refused
        that one (``work_exists``, ``unknown_binding``, an invalid id or payload)."""
        results: list[Work | ConduitError | None] = []
        valid: list[tuple[Work, Event | None]] = []
        for work, first_input in items:
            try:
                checked = self._check_submit(work, first_input)
            except ConduitError as exc:
                results.append(exc)
                continue
            results.append(None)
            valid.append((checked, first_input))
        created = iter(await self.store.create_works(valid))
        return [next(created) if r is None else r for r in results]

    def _check_submit(self, work: Work, first_input: Event | None) -> Work:
        """The Work as it is stored: with its binding's concurrency key rendered over the first
        input, and a Routine's Work with its binding's priority (a submit sets its own)."""
        check_work_id(work.id, "id")
        if work.dependencies is not None:
            for index, dependency in enumerate(work.dependencies.after):
                check_work_id(dependency, f"after[{index}]")
        if first_input is not None:
            check_payload("$.input", first_input.payload)
        binding = self.options.bindings.get(work.binding)
        if binding is None:
            raise ConduitError(f"unknown binding {work.binding!r}", code="unknown_binding")
        if binding.concurrency_key is not None and work.concurrency_key is None:
            payload = None if first_input is None else first_input.payload
            key = render_concurrency_key(binding.concurrency_key, payload)
            work = msgspec.structs.replace(work, concurrency_key=key, key_limit=binding.key_limit)
        if work.scheduled_by != "manual" and work.priority == 0:
            work = msgspec.structs.replace(work, priority=binding.priority)
        return work

    async def fire_due_timers(self, *, limit: int = 100) -> list[str]:
        """Fire due timers once each; a retry timer accepts ``core.retry`` as the Work's input."""
        return await self.wakes.fire_due_timers(limit=limit)

    async def manual_retry(
        self, work_id: str, *, reason: str = "", actor: str | None = None
    ) -> Work:
        """``core.manual.retry``: reset the failure budget (not attempt numbering) and run again."""
        return await self.wakes.manual_retry(work_id, reason=reason, actor=actor)

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]:
        """Accept an event; wake parked attempts whose wait it matches (never their own Work's).

        Returns the stored event and the claims of resumed attempts (run them with
        :meth:`run_resumed`).
        """
        check_payload("$.payload", event.payload)
        return await self.wakes.accept_input(event)

    async def run_resumed(self, claim: Claim) -> Execution:
        """Resume a woken attempt on its pinned executor, under a new segment, to its end."""
        with traced(claim.execution, "resume") as trace:
            ended = await self.wakes.run_resumed(claim)
            trace.ended(str(ended.status), failure_code=ended.failure_code, epoch=ended.epoch)
            return ended

    async def run_ready(self, limit: int) -> list[Execution]:
        """Claim up to ``limit`` ready Work and run each to its end, concurrently."""
        claims, _ = await self.claim_ready(limit)
        results: list[Execution] = []

        async def run_one(claim: Claim) -> None:
            results.append(await self.run_attempt(claim))

        async with anyio.create_task_group() as tg:
            for claim in claims:
                tg.start_soon(run_one, claim)
        return results


def _check_submit_key(key: SubmitKey) -> None:
    field = "$.debounce.key" if key.debounced else "$.dedup_key"
    if not 0 < len(key.key) <= ID_MAX_LENGTH:
        raise InvalidValueError(field, f"a key has 1 to {ID_MAX_LENGTH} characters",
                                code="invalid_key")  # fmt: skip
    if key.debounced:
        assert key.quiet_ms is not None
        if key.quiet_ms <= 0:
            raise InvalidValueError("$.debounce.quiet", "must be longer than 0",
                                    code="invalid_duration")  # fmt: skip
        if key.max_wait_ms is not None and key.max_wait_ms < key.quiet_ms:
            raise InvalidValueError("$.debounce.max_wait", "must be at least the quiet period",
                                    code="invalid_duration")  # fmt: skip
    elif key.scope is DedupScope.WINDOW and key.window_ms <= 0:
        raise InvalidValueError("$.dedup_window", "must be longer than 0",
                                code="invalid_duration")  # fmt: skip


def _binding_pools(options: SchedulerOptions, plugins: Plugins) -> dict[str, str | None]:
    """The pool each binding's executor counts against (bindings whose executor is not loaded
    are left out: their Work cannot be pinned, so no claim takes it)."""
    pools: dict[str, str | None] = {}
    for name, binding in options.bindings.items():
        try:
            pools[name] = plugins.executor_info(binding.executor).pool
        except (ConduitError, LookupError):
            continue
    return pools
