"""The fire path: turn a claimed Routine into Work (or input for a bound Work), and settle it.

A fire is keyed by ``(routine, scheduled_for)`` (:func:`~conduit_core.routines.ledger.fire_key`):
the Work id and its first input's delivery id derive from the key, so a retried fire (after a
crash, or by a second ticker) finds the Work it made and never creates a second one. The Routine
stays ``running`` until that Work is terminal (one pending run per Routine); then
:func:`settle_fire` re-arms it (success) or halts it in ``error`` (failure).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import Event, Routine, RoutineStatus, Work, WorkKind, WorkStatus
from conduit_core.routines import ledger
from conduit_core.routines.errors import (
    BoundRecurringScheduleError,
    DuplicateFiringOwnerError,
    IllegalTransitionError,
    StaleRoutineClaimError,
)
from conduit_core.storage import Claim, RoutineRun, Store
from conduit_core.telemetry import METRICS

__all__ = [
    "FIRE_INPUT_TYPE",
    "FireTarget",
    "check_bound_owner",
    "fire_claimed",
    "fire_outcome",
    "firing_owner",
    "is_fired_by_routine",
    "routine_event",
    "settle_fire",
]

log = logging.getLogger("conduit.routines")

#: The event type of the input a fire delivers (to its new Work or to a bound Work).
FIRE_INPUT_TYPE = "core.routine.fire"
#: Prefix of the stored observability events: ``core.routine.fired`` and so on.
EVENT_PREFIX = "core.routine."

_OWNER_PREFIX = "routine:"

OnResumed = Callable[[list[Claim]], Awaitable[None] | None]


class FireTarget(Protocol):
    """What a fire feeds: :class:`conduit_core.runtime.Scheduler` (or a stand-in in tests)."""

    async def submit(self, work: Work, first_input: Event | None = None) -> Work: ...

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]: ...


def firing_owner(routine_id: str) -> str:
    """The ``Work.scheduled_by`` label of Work this Routine fires."""
    return f"{_OWNER_PREFIX}{routine_id}"


def is_fired_by_routine(work: Work) -> bool:
    """Whether a Routine fires ``work`` (a Work it created, or the existing Work it binds)."""
    return work.scheduled_by.startswith(_OWNER_PREFIX)


def check_bound_owner(routine: Routine, work: Work | None) -> Work | None:
    """The one-firing-owner invariant, run inside the create transaction on the fresh Work.

    A bound Routine must be a one-shot; its Work must exist and be ``manual`` (then it is stamped
    with this Routine as its owner) or already owned by this Routine.
    """
    bound = routine.target.work_id
    if bound is None:
        return None
    if ledger.spec_of(routine).is_recurring:
        raise BoundRecurringScheduleError(
            f"routine {routine.id!r}: a recurring spec {routine.cron_spec!r} cannot be bound to "
            f"existing work {bound!r}; bind a once@ spec, or let each fire create its own Work"
        )
    if work is None:
        raise NotFoundError("work", bound)
    owner = firing_owner(routine.id)
    if work.scheduled_by == owner:
        return None
    if work.scheduled_by != "manual":
        raise DuplicateFiringOwnerError(
            f"work {bound!r} is already fired by {work.scheduled_by!r}; a Work has one firing "
            f"owner, so routine {routine.id!r} cannot bind it"
        )
    return msgspec.structs.replace(work, scheduled_by=owner)


def routine_event(routine: Routine, kind: str, key: str, now_ms: int, **payload: Any) -> Event:
    """A stored observability event ``core.routine.<kind>`` (unmatched: it feeds no Work)."""
    ident = f"routine-event/{routine.id}/{key}/{kind}"
    body = {"routine_id": routine.id, **payload}
    log.info(
        "routine_%s routine=%s %s",
        kind,
        routine.id,
        " ".join(f"{k}={v}" for k, v in payload.items()),
    )
    return Event(
        id=ident,
        delivery_id=ident,
        type=f"{EVENT_PREFIX}{kind}",
        payload=body,
        scope=routine.scope,
        unmatched=True,
        accepted_at_ms=now_ms,
    )


def _fire_input(routine: Routine, key: str, work_id: str, scope: str, now_ms: int) -> Event:
    return Event(
        id=f"{key}/input",
        delivery_id=f"{key}/input",
        type=FIRE_INPUT_TYPE,
        payload=routine.target.input,
        work_id=work_id,
        scope=scope,
        pending=True,
        accepted_at_ms=now_ms,
    )


async def fire_claimed(
    store: Store,
    target: FireTarget,
    routine: Routine,
    *,
    now_ms: int,
    on_resumed: OnResumed | None = None,
) -> Routine | None:
    """Fire a Routine this caller claimed: misfire decision, Work (or input), then ``running``.

    Returns the Routine as written, or ``None`` when a newer claim or a deletion took the row.
    """
    token = routine.claim_token
    assert token is not None, "fire_claimed needs a claimed row"
    spec = ledger.readable_spec(routine)
    if isinstance(spec, ConduitError):
        error = f"stored spec cannot be read: [{spec.code}] {spec.message}"
        return await _apply(
            store,
            routine.id,
            lambda r: ledger.fail_fire(r, token=token, error=error, now_ms=now_ms),
            events=[routine_event(routine, "error", token, now_ms, error=error)],
        )
    decision = ledger.plan_fire(routine, spec, now_ms)
    METRICS.routine_misfired(routine.id, str(routine.misfire), decision.skipped)
    if not decision.fire:
        event = routine_event(
            routine,
            "skipped",
            token,
            now_ms,
            skipped=decision.skipped,
            next_run_at_ms=decision.next_run_at_ms,
        )
        return await _apply(
            store,
            routine.id,
            lambda r: ledger.skip_fire(
                r, token=token, next_run_at_ms=decision.next_run_at_ms, now_ms=now_ms
            ),
            events=[event],
        )
    scheduled = decision.scheduled_for_ms
    assert scheduled is not None
    key = ledger.fire_key(routine.id, scheduled)
    fired = routine_event(
        routine,
        "fired",
        token,
        now_ms,
        scheduled_for_ms=scheduled,
        late_ms=now_ms - scheduled,
        coalesced=decision.skipped,
    )
    METRICS.routine_fired((now_ms - scheduled) / 1000)
    try:
        work_id = await _dispatch(target, routine, key, now_ms, on_resumed)
    except ConduitError as exc:
        error = f"fire of {scheduled} could not dispatch: [{exc.code}] {exc.message}"
        run = RoutineRun(
            routine_id=routine.id,
            scheduled_for_ms=scheduled,
            outcome="error",
            error=error,
            started_at_ms=now_ms,
            ended_at_ms=now_ms,
        )
        failed = routine_event(routine, "error", token, now_ms, error=error)

        def start_then_fail(r: Routine) -> Routine:
            started = ledger.start_fire(
                r, token=token, scheduled_for_ms=scheduled, fired_work_id=None, now_ms=now_ms
            )
            return ledger.fail_fire(started, token=token, error=error, now_ms=now_ms)

        return await _apply(store, routine.id, start_then_fail, run=run, events=[fired, failed])
    run = RoutineRun(
        routine_id=routine.id,
        scheduled_for_ms=scheduled,
        work_id=work_id,
        outcome="running",
        started_at_ms=now_ms,
    )
    dispatched = routine_event(
        routine, "dispatched", token, now_ms, scheduled_for_ms=scheduled, work_id=work_id
    )
    return await _apply(
        store,
        routine.id,
        lambda r: ledger.start_fire(
            r, token=token, scheduled_for_ms=scheduled, fired_work_id=work_id, now_ms=now_ms
        ),
        run=run,
        events=[fired, dispatched],
    )


async def _dispatch(
    target: FireTarget, routine: Routine, key: str, now_ms: int, on_resumed: OnResumed | None
) -> str:
    """Create the fire's Work (idempotently) or deliver input to the bound Work; its id."""
    template = routine.target
    scope = template.scope or routine.scope
    if template.work_id is not None:
        event = _fire_input(routine, key, template.work_id, scope, now_ms)
        _, resumed = await target.accept_input(event)
        if resumed and on_resumed is not None:
            pending = on_resumed(resumed)
            if pending is not None:
                await pending
        return template.work_id
    if template.binding is None:
        raise ConduitError(f"routine {routine.id!r} has no binding", code="unknown_binding")
    work = Work(
        id=key,
        scope=scope,
        binding=template.binding,
        kind=template.kind,
        scheduled_by=firing_owner(routine.id),
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )
    try:
        await target.submit(work, _fire_input(routine, key, key, scope, now_ms))
    except ConduitError as exc:
        if exc.code != "work_exists":
            raise
        log.info("routine %s: work %s exists already (a retried fire)", routine.id, key)
    return key


def fire_outcome(routine: Routine, work: Work, input_pending: bool) -> tuple[bool, str] | None:
    """Whether the fired Work settled the fire: ``(succeeded, detail)``, or ``None`` (pending).

    Terminal Work decides by its status; a blocked Work (permanent failure, retries exhausted)
    is a failure. Input delivered to a bound Work, or a standing Work's input, is done once an
    attempt consumed it and nothing runs; a bound Work already over counts as satisfied.
    """
    if work.status.terminal:
        if routine.target.work_id is not None or work.status is WorkStatus.COMPLETED:
            return True, f"work {work.id} {work.status}"
        return False, f"work {work.id} ended {work.status}"
    if work.blocked_reason is not None:
        return False, f"work {work.id} blocked: {work.blocked_reason}"
    open_ended = routine.target.work_id is not None or work.kind is WorkKind.STANDING
    if open_ended and not input_pending and work.status is WorkStatus.READY:
        return True, f"work {work.id} consumed the fire's input"
    return None


async def settle_fire(store: Store, routine: Routine, *, now_ms: int) -> Routine | None:
    """Settle a ``running`` Routine whose Work is done; ``None`` while it is still pending."""
    token, work_id, scheduled = routine.claim_token, routine.fired_work_id, routine.scheduled_for_ms
    if routine.status is not RoutineStatus.RUNNING or token is None or scheduled is None:
        return None
    key = ledger.fire_key(routine.id, scheduled)
    outcome: tuple[bool, str] | None
    try:
        if work_id is None:
            raise NotFoundError("work", "(none)")
        work = await store.get_work(work_id)
        try:
            pending = (await store.get_event(f"{key}/input")).pending
        except NotFoundError:
            pending = False
        outcome = fire_outcome(routine, work, pending)
    except NotFoundError:
        outcome = (False, f"fired work {work_id} no longer exists")
    if outcome is None:
        return None
    ok, detail = outcome
    spec = ledger.readable_spec(routine)
    if ok and isinstance(spec, ConduitError):
        ok, detail = False, f"{detail}; cannot re-arm: the stored spec cannot be read: {spec}"
    run = RoutineRun(
        routine_id=routine.id,
        scheduled_for_ms=scheduled,
        work_id=work_id,
        outcome="completed" if ok else "failed",
        error=None if ok else detail,
        started_at_ms=routine.last_run_at_ms or now_ms,
        ended_at_ms=now_ms,
    )
    if ok and not isinstance(spec, ConduitError):
        readable = spec
        event = routine_event(routine, "completed", token, now_ms, work_id=work_id, detail=detail)
        return await _apply(
            store,
            routine.id,
            lambda r: ledger.succeed_fire(r, token=token, spec=readable, now_ms=now_ms),
            run=run,
            events=[event],
        )
    event = routine_event(routine, "error", token, now_ms, work_id=work_id, error=detail)
    return await _apply(
        store,
        routine.id,
        lambda r: ledger.fail_fire(r, token=token, error=detail, now_ms=now_ms),
        run=run,
        events=[event],
    )


async def _apply(
    store: Store,
    routine_id: str,
    change: Callable[[Routine], Routine],
    *,
    run: RoutineRun | None = None,
    events: Sequence[Event] = (),
) -> Routine | None:
    """A fenced outcome write; a stale token or a removed row means someone else moved on."""
    try:
        return await store.apply_routine(routine_id, change, run=run, events=events)
    except (StaleRoutineClaimError, IllegalTransitionError, NotFoundError) as exc:
        log.info("routine %s: outcome not written (%s)", routine_id, exc)
        return None
