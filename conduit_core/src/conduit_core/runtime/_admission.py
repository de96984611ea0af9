"""Admission: the start gates and budgets a start passes after capacity.

A start is admitted in three steps. A read-only dry run of the claim tells which Work eligibility
and capacity would let start (so a gate is never asked about Work capacity would refuse). The
start gates are asked, in registration-name order and outside any transaction, only before a
Work's first attempt. Then one claim transaction rechecks capacity, commits a gate's hold,
checks and charges budgets, and claims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import msgspec

from conduit_core.errors import ConduitError
from conduit_core.extension import GateRequest, StartHold
from conduit_core.model import AttemptSnapshot, Event, HoldKind, Work
from conduit_core.plugins import Plugins
from conduit_core.runtime._budgets import BudgetBook
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._inputs import presented
from conduit_core.runtime._options import SchedulerOptions
from conduit_core.storage import (
    AdmitRequest,
    Candidate,
    Claim,
    ClaimRefusal,
    GateFilter,
    GateVerdict,
    Store,
    needs_gates,
    refusal_error,
)

__all__ = ["HUMAN_GATE", "Admission", "NeedsYou", "StartGateError", "needs_you"]

log = logging.getLogger("conduit.runtime")

#: The registration name of the human-approval gate (``conduit-gate-human``).
HUMAN_GATE = "human"


class StartGateError(ConduitError):
    """A start gate failed to decide: nothing is held and it is asked again on the next pass."""

    code = "start_gate_failed"


class Admission:
    """``Admission(store, clock, plugins, options, pin)``: ``pin`` pins a Work's attempt from
    the current bindings and manifests (it raises for an unknown binding or generation)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        plugins: Plugins,
        options: SchedulerOptions,
        pin: Callable[[Work], AttemptSnapshot],
    ) -> None:
        self.store = store
        self.clock = clock
        self.plugins = plugins
        self.options = options
        self.pin = pin

    def active(self) -> bool:
        """Admission runs when a gate is registered or a budget configured (off by default)."""
        return bool(self.options.budgets) or bool(self.plugins.start_gates())

    def budget_book(self) -> BudgetBook:
        return BudgetBook(self.options.budgets, self.options.scope_parents)

    async def claim(self, work_id: str) -> Claim:
        """Admit and claim one Work's next attempt; raises the refusal as an error."""
        work = await self.store.get_work(work_id)
        snapshot = self.pin(work)  # unknown binding / generation: raise, as before
        claims, refusals = await self._admit([work_id], 1, lambda _: snapshot)
        if claims:
            return claims[0]
        (refusal,) = refusals
        if refusal.code == StartGateError.code:
            raise StartGateError(refusal.message)
        raise refusal_error(refusal)

    async def claim_ready(self, limit: int) -> tuple[list[Claim], list[ClaimRefusal]]:
        """Admit and claim up to ``limit`` ready Work; refusals (held, over budget…) returned."""

        def snapshot_for(work: Work) -> AttemptSnapshot | None:
            try:
                return self.pin(work)
            except ConduitError as exc:
                log.warning("work %s cannot be pinned: %s", work.id, exc)
                return None

        return await self._admit(None, limit, snapshot_for)

    async def _admit(
        self,
        work_ids: list[str] | None,
        limit: int,
        snapshot_for: Callable[[Work], AttemptSnapshot | None],
    ) -> tuple[list[Claim], list[ClaimRefusal]]:
        store, options = self.store, self.options
        capacity = options.capacity()
        gates = self.gate_filter()
        claims: list[Claim] = []
        refusals: list[ClaimRefusal] = []
        if work_ids is None:
            # The ready queue: what no gate must be asked about is admitted at once, in the
            # transaction that locks it; the rest comes back to be asked about, as a dry run's.
            admitted, candidates = await store.admit_ready(
                limit=limit,
                snapshot_for=snapshot_for,
                max_inputs=options.max_inputs,
                owner=options.owner,
                now_ms=self.clock.now_ms(),
                lease_ms=options.lease_ms,
                capacity=capacity,
                budgets=self.budget_book(),
                gates=gates,
            )
            claims = [o for o in admitted if isinstance(o, Claim)]
            refusals = [o for o in admitted if isinstance(o, ClaimRefusal)]
        else:
            candidates = await store.admission_candidates(
                work_ids=work_ids, snapshot_for=snapshot_for, capacity=capacity
            )
        slots: list[AdmitRequest | ClaimRefusal | None] = []
        asks: list[tuple[int, Candidate]] = []
        for candidate in candidates:
            work, snapshot = candidate.work, candidate.snapshot
            if candidate.refused is not None:
                refusals.append(candidate.refused)
            # admit_ready returns only Work its transaction found the gates must be asked about.
            elif work_ids is None or needs_gates(work, gates, snapshot, candidate.first_input):
                asks.append((len(slots), candidate))
                slots.append(None)
            else:
                slots.append(
                    AdmitRequest(work_id=work.id, snapshot=snapshot, max_inputs=options.max_inputs)
                )

        async def ask(index: int, c: Candidate) -> None:
            slots[index] = await self.ask_gates(c.work, c.snapshot, c.first_input)

        if asks:
            async with anyio.create_task_group() as tg:
                for index, candidate in asks:
                    tg.start_soon(ask, index, candidate)
        requests = [s for s in slots if isinstance(s, AdmitRequest)]
        refusals.extend(s for s in slots if isinstance(s, ClaimRefusal))
        if not requests:
            return claims, refusals
        outcomes = await store.admit_attempts(
            requests,
            owner=options.owner,
            now_ms=self.clock.now_ms(),
            lease_ms=options.lease_ms,
            capacity=capacity,
            budgets=self.budget_book(),
            gates=gates,
        )
        claims.extend(o for o in outcomes if isinstance(o, Claim))
        refusals.extend(o for o in outcomes if isinstance(o, ClaimRefusal))
        return claims, refusals

    def gate_filter(self) -> GateFilter | None:
        """Which first starts the gates must be asked about: those some registered gate's
        ``may_hold`` says it could hold (``None``: no gate is registered). The store calls it
        in the claim transaction; a gate whose ``may_hold`` raises is asked."""
        registrations = self.plugins.start_gates()
        if not registrations:
            return None

        def may_hold(work: Work, snapshot: AttemptSnapshot, first: Event | None) -> bool:
            request = gate_request(work, snapshot, first)
            for registration in registrations:
                try:
                    if registration.gate.may_hold(request):
                        return True
                except Exception as exc:
                    log.warning(
                        "start gate %r failed to say whether it may hold work %s (%s): asking it",
                        registration.name, work.id, type(exc).__name__,
                    )  # fmt: skip
                    return True
            return False

        return may_hold

    async def ask_gates(
        self, work: Work, snapshot: AttemptSnapshot, first: Event | None
    ) -> AdmitRequest | ClaimRefusal:
        """Ask every start gate in registration-name order, outside any transaction."""
        request = gate_request(work, snapshot, first)
        for registration in self.plugins.start_gates():
            try:
                answer = await registration.gate.check(request)
                if answer is not None and not isinstance(answer, StartHold):
                    raise TypeError(f"check returned {type(answer).__name__}, not StartHold | None")
            except Exception as exc:
                # Fail closed: nothing is held, and the next pass asks again.
                log.warning(
                    "start gate %r failed to decide for work %s: %s",
                    registration.name, work.id, type(exc).__name__,
                )  # fmt: skip
                return ClaimRefusal(
                    work_id=work.id,
                    code=StartGateError.code,
                    message=f"start gate {registration.name!r} failed to decide "
                    f"({type(exc).__name__}); it is asked again on the next pass",
                )
            if answer is not None:
                return self._request(work, snapshot, GateVerdict.HOLD, registration.name, answer)
        return self._request(work, snapshot, GateVerdict.LET, "", None)

    def _request(
        self,
        work: Work,
        snapshot: AttemptSnapshot,
        verdict: GateVerdict,
        holder: str,
        hold: StartHold | None,
    ) -> AdmitRequest:
        # Asking may have taken a while, and the deadline counts from the claim: the rest of
        # the pin (made a moment ago, from the same options) stands.
        timeout_ms = round(snapshot.timeout_seconds * 1000)
        snapshot = msgspec.structs.replace(snapshot, deadline_ms=self.clock.now_ms() + timeout_ms)
        return AdmitRequest(
            work_id=work.id,
            snapshot=snapshot,
            max_inputs=self.options.max_inputs,
            gates=verdict,
            holder=holder,
            reason=hold.reason if hold is not None else "",
        )


def gate_request(work: Work, snapshot: AttemptSnapshot, first: Event | None) -> GateRequest:
    """What the gates see of a Work's first start."""
    return GateRequest(
        work_id=work.id,
        scope=work.scope,
        kind=str(work.kind),
        binding=work.binding,
        executor=snapshot.executor,
        first_input=None if first is None else presented(first),
    )


# --- The needs-you list ---------------------------------------------------------------------


class NeedsYou(msgspec.Struct, frozen=True, kw_only=True):
    """Held Work, why, and how a person settles it.

    ``kind``: ``budget`` or ``gate`` (a hold on the Work), ``recovery`` (its attempt's recovery
    is held; ``holder`` is the code) or ``stop`` (an ended attempt whose stop is unverified;
    ``holder`` is its execution id). The last two name the attempt and its ``epoch``.
    """

    work_id: str
    kind: str
    holder: str
    reason: str
    held_since_ms: int
    binding: str
    scope: str
    settle: str
    execution_id: str | None = None
    epoch: int | None = None


def how_to_settle(work_id: str, kind: HoldKind, holder: str) -> str:
    if kind is HoldKind.BUDGET:
        budget = holder.split("|", 1)[0]
        return (
            f"conduit release {work_id} (lets one more start through), or raise budget "
            f"{budget!r} in conduit.toml"
        )
    if holder == HUMAN_GATE:
        return f"conduit approve {work_id} [--reason R], or conduit refuse {work_id} --reason R"
    return f"settled by start gate {holder!r} only; or cancel it: conduit work cancel {work_id}"


async def needs_you(store: Store) -> list[NeedsYou]:
    """Every held Work (budget and gate holds), every held recovery and every ended attempt
    whose stop is unverified, with the reason and how to settle it."""
    items = [
        NeedsYou(
            work_id=hold.work_id,
            kind=str(hold.kind),
            holder=hold.holder,
            reason=hold.reason,
            held_since_ms=hold.created_at_ms,
            binding=work.binding,
            scope=work.scope,
            settle=how_to_settle(hold.work_id, hold.kind, hold.holder),
        )
        for hold, work in await store.held_work()
    ]
    for ex in await store.held_recoveries():
        assert ex.recovery_hold is not None
        held = ex.recovery_hold
        items.append(
            NeedsYou(
                work_id=ex.work_id, kind="recovery", holder=held.code,
                reason=f"recovery of attempt {ex.id} cannot tell whether it still runs "
                f"(tried {held.tries}x): {held.message}",
                held_since_ms=held.since_ms, binding=ex.snapshot.binding, scope=ex.scope,
                settle=held.settle, execution_id=ex.id, epoch=ex.epoch,
            )
        )  # fmt: skip
    for ex in await store.unconfirmed_exclusions():
        items.append(
            NeedsYou(
                work_id=ex.work_id, kind="stop", holder=ex.id,
                reason=f"attempt {ex.id} ended ({ex.failure_code or ex.status}) but its stop "
                "is not verified: no new attempt of the Work starts",
                held_since_ms=ex.ended_at_ms or ex.started_at_ms, binding=ex.snapshot.binding,
                scope=ex.scope,
                settle="conduit retries the stop on every pass; or, once you know it no longer "
                f"runs: conduit work confirm-stopped {ex.work_id} --epoch {ex.epoch}",
                execution_id=ex.id, epoch=ex.epoch,
            )
        )  # fmt: skip
    return items
