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
from conduit_core.model import (
    Dependencies,
    Event,
    Routine,
    RoutineStatus,
    Work,
    WorkKind,
    WorkStatus,
)
from conduit_core.routines import ledger
from conduit_core.routines.errors import (
    BoundRecurringScheduleError,
    DuplicateFiringOwnerError,
    IllegalTransitionError,
    StaleRoutineClaimError,
)
from conduit_core.routines.occurrence import MisfireDecision
from conduit_core.storage import Claim, RoutineRun, RoutineUpdate, Store, SubmitKey, Submitted
from conduit_core.telemetry import METRICS

__all__ = [
    "FIRE_INPUT_TYPE",
    "FireTarget",
    "KeyFor",
    "check_bound_owner",
    "fire_claimed",
    "fire_claimed_many",
    "fire_input_id",
    "fire_outcome",
    "fired_by",
    "firing_owner",
    "is_fired_by_routine",
    "routine_event",
    "settle_fire",
    "settle_update",
]

log = logging.getLogger("conduit.routines")

#: The event type of the input a fire delivers (to its new Work or to a bound Work).
FIRE_INPUT_TYPE = "core.routine.fire"
#: Fire outcomes per store write of a batched fire.
OUTCOME_CHUNK = 250
#: Prefix of the stored observability events: ``core.routine.fired`` and so on.
EVENT_PREFIX = "core.routine."

_OWNER_PREFIX = "routine:"

OnResumed = Callable[[list[Claim]], Awaitable[None] | None]
#: The dedup or debounce key a fire's Work goes under: its binding's templates over the fire's
#: input (``None``: the binding declares none); raises the refusal of an input a template
#: cannot read.
KeyFor = Callable[[str, Any], SubmitKey | None]


class FireTarget(Protocol):
    """What a fire feeds: :class:`conduit_core.runtime.Scheduler` (or a stand-in in tests)."""

    async def submit(self, work: Work, first_input: Event | None = None) -> Work: ...

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]: ...


#: ``Scheduler.submit_keyed``: a target's submit under a key (a target without one submits
#: every fire unkeyed).
SubmitKeyed = Callable[[Work, SubmitKey, Event | None], Awaitable[Submitted]]


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


def fired_by(work: Work) -> str | None:
    """The id of the Routine that fires ``work`` (``None``: no Routine does)."""
    if not is_fired_by_routine(work):
        return None
    return work.scheduled_by.removeprefix(_OWNER_PREFIX)


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


def _unreadable(routine: Routine, token: str, spec: ConduitError, now_ms: int) -> RoutineUpdate:
    error = f"stored spec cannot be read: [{spec.code}] {spec.message}"
    return RoutineUpdate(
        routine.id,
        lambda r: ledger.fail_fire(r, token=token, error=error, now_ms=now_ms),
        events=[routine_event(routine, "error", token, now_ms, error=error)],
    )


def _skipped(routine: Routine, token: str, decision: MisfireDecision, now_ms: int) -> RoutineUpdate:
    event = routine_event(
        routine,
        "skipped",
        token,
        now_ms,
        skipped=decision.skipped,
        next_run_at_ms=decision.next_run_at_ms,
    )
    return RoutineUpdate(
        routine.id,
        lambda r: ledger.skip_fire(
            r, token=token, next_run_at_ms=decision.next_run_at_ms, now_ms=now_ms
        ),
        events=[event],
    )


def _fired_event(routine: Routine, token: str, decision: MisfireDecision, now_ms: int) -> Event:
    scheduled = decision.scheduled_for_ms
    assert scheduled is not None
    METRICS.routine_fired((now_ms - scheduled) / 1000, routine.id, routine.grace_seconds)
    return routine_event(
        routine,
        "fired",
        token,
        now_ms,
        scheduled_for_ms=scheduled,
        late_ms=now_ms - scheduled,
        coalesced=decision.skipped,
    )


def _not_dispatched(
    routine: Routine, token: str, scheduled: int, fired: Event, exc: ConduitError, now_ms: int
) -> RoutineUpdate:
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

    return RoutineUpdate(routine.id, start_then_fail, run=run, events=[fired, failed])


def _dispatched(
    routine: Routine, token: str, scheduled: int, fired: Event, work_id: str, now_ms: int
) -> RoutineUpdate:
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
    return RoutineUpdate(
        routine.id,
        lambda r: ledger.start_fire(
            r, token=token, scheduled_for_ms=scheduled, fired_work_id=work_id, now_ms=now_ms
        ),
        run=run,
        events=[fired, dispatched],
    )


def _plan(routine: Routine, now_ms: int) -> RoutineUpdate | MisfireDecision:
    """What a claimed row's fire does: an outcome written at once (unreadable spec, misfire
    skip), or the decision to fire an occurrence."""
    token = routine.claim_token
    assert token is not None, "a fire needs a claimed row"
    spec = ledger.readable_spec(routine)
    if isinstance(spec, ConduitError):
        return _unreadable(routine, token, spec, now_ms)
    decision = ledger.plan_fire(routine, spec, now_ms)
    METRICS.routine_misfired(routine.id, str(routine.misfire), decision.skipped)
    if not decision.fire:
        METRICS.routine_skipped(routine.id)
        return _skipped(routine, token, decision, now_ms)
    return decision


async def fire_claimed(
    store: Store,
    target: FireTarget,
    routine: Routine,
    *,
    now_ms: int,
    on_resumed: OnResumed | None = None,
    key_for: KeyFor | None = None,
) -> Routine | None:
    """Fire a Routine this caller claimed: misfire decision, Work (or input), then ``running``.
    ``key_for``: the binding's dedup or debounce key of the fire's Work (a fire that finds the
    key's Work takes it as its fired Work).

    Returns the Routine as written, or ``None`` when a newer claim or a deletion took the row.
    """
    plan = _plan(routine, now_ms)
    if isinstance(plan, RoutineUpdate):
        return await _apply(store, plan)
    token, scheduled = routine.claim_token, plan.scheduled_for_ms
    assert token is not None
    assert scheduled is not None
    key = ledger.fire_key(routine.id, scheduled)
    fired = _fired_event(routine, token, plan, now_ms)
    try:
        work_id = await _dispatch(target, routine, key, now_ms, on_resumed, key_for)
    except ConduitError as exc:
        return await _apply(store, _not_dispatched(routine, token, scheduled, fired, exc, now_ms))
    return await _apply(store, _dispatched(routine, token, scheduled, fired, work_id, now_ms))


async def fire_claimed_many(
    store: Store,
    target: FireTarget,
    routines: Sequence[Routine],
    *,
    now_ms: int,
    on_created: Callable[[], None] | None = None,
    key_for: KeyFor | None = None,
) -> list[Routine]:
    """Fire many claimed Routines in two store writes: their new Work with first inputs in one
    (``target.submit_many``), every outcome (``running``, a skip, an error) in the other.

    Only Routines that create Work are fired here, and only when ``target`` can submit many;
    the rest (bound Routines deliver input and may resume a parked attempt; a binding with a
    dedup or debounce key decides under the key's row) are returned for :func:`fire_claimed`.
    ``on_created`` is called once the Work exists (wake the scheduler).
    Each fire is the one :func:`fire_claimed` makes: same Work id and input (its fire key),
    same events, same fenced transitions.
    """
    submit_many = getattr(target, "submit_many", None)
    if submit_many is None:
        return list(routines)
    rest: list[Routine] = []
    updates: list[RoutineUpdate] = []
    fires: list[tuple[Routine, int, Event]] = []
    items: list[tuple[Work, Event]] = []
    for routine in routines:
        if (
            routine.target.work_id is not None
            or routine.target.binding is None
            or routine.target.then  # a group: its steps are submitted in order (fire_claimed)
            or _keyed(routine, key_for)
        ):
            rest.append(routine)
            continue
        plan = _plan(routine, now_ms)
        if isinstance(plan, RoutineUpdate):
            updates.append(plan)
            continue
        token, scheduled = routine.claim_token, plan.scheduled_for_ms
        assert token is not None
        assert scheduled is not None
        key = ledger.fire_key(routine.id, scheduled)
        fires.append((routine, scheduled, _fired_event(routine, token, plan, now_ms)))
        work = _fire_work(routine, key, now_ms)
        items.append((work, _fire_input(routine, key, key, work.scope, now_ms)))
    if items:
        created: list[Work | ConduitError] = await submit_many(items)
        if on_created is not None:
            on_created()
        for (routine, scheduled, fired), (work, _), result in zip(
            fires, items, created, strict=True
        ):
            token = routine.claim_token
            assert token is not None
            if isinstance(result, ConduitError) and result.code != "work_exists":
                updates.append(_not_dispatched(routine, token, scheduled, fired, result, now_ms))
                continue
            if isinstance(result, ConduitError):
                log.info("routine %s: work %s exists already (a retried fire)", routine.id, work.id)
            updates.append(_dispatched(routine, token, scheduled, fired, work.id, now_ms))
    # In chunks: the scheduler, just woken, claims the new Work between them.
    for offset in range(0, len(updates), OUTCOME_CHUNK):
        chunk = updates[offset : offset + OUTCOME_CHUNK]
        for update, written in zip(chunk, await store.apply_routines(chunk), strict=True):
            if isinstance(written, ConduitError):
                log.info("routine %s: outcome not written (%s)", update.routine_id, written)
    return rest


async def _dispatch(
    target: FireTarget,
    routine: Routine,
    key: str,
    now_ms: int,
    on_resumed: OnResumed | None,
    key_for: KeyFor | None = None,
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
    work = _fire_work(routine, key, now_ms)
    first_input = _fire_input(routine, key, key, scope, now_ms)
    submit_key = None
    if key_for is not None and not template.then:  # a group's steps are chained by id, unkeyed
        submit_key = key_for(template.binding, template.input)
    submit_keyed: SubmitKeyed | None = getattr(target, "submit_keyed", None)
    if submit_key is not None and submit_keyed is not None:
        return await _submit_keyed(submit_keyed, routine, work, first_input, submit_key)
    group = [(work, first_input), *_then(routine, key, now_ms)]
    for member, first_input in group:  # in order: each step's dependency exists before it
        try:
            await target.submit(member, first_input)
        except ConduitError as exc:
            if exc.code != "work_exists":
                raise
            log.info("routine %s: work %s exists already (a retried fire)", routine.id, member.id)
    return group[-1][0].id


async def _submit_keyed(
    submit_keyed: SubmitKeyed, routine: Routine, work: Work, first_input: Event, key: SubmitKey
) -> str:
    """Submit the fire's Work under its binding's key: the Work the key already names (its
    fired Work then, the fire joining it as any submit would), or the new one."""
    try:
        submitted = await submit_keyed(work, key, first_input)
    except ConduitError as exc:
        if exc.code != "work_exists":
            raise
        log.info("routine %s: work %s exists already (a retried fire)", routine.id, work.id)
        return work.id
    if submitted.deduplicated:
        log.info("routine %s: %s key %r names work %s: the fire takes it", routine.id, key.kind,
                 key.key, submitted.work.id)  # fmt: skip
    return submitted.work.id


def _keyed(routine: Routine, key_for: KeyFor | None) -> bool:
    """Whether a fire of ``routine`` goes under its binding's key (a key that cannot be made
    counts: :func:`fire_claimed` records the refusal)."""
    binding = routine.target.binding
    if key_for is None or binding is None or routine.target.then:
        return False
    try:
        return key_for(binding, routine.target.input) is not None
    except ConduitError:
        return True


def _then(routine: Routine, key: str, now_ms: int) -> list[tuple[Work, Event]]:
    """The Work a fire chains after its first (``target.then``): step ``n`` (2, 3, …) is
    ``<fire key>.<n>``, after step ``n - 1``, with the step's input. The fire is settled by
    the last step (``fired_work_id``)."""
    chained: list[tuple[Work, Event]] = []
    previous = key
    for n, step in enumerate(routine.target.then, start=2):
        work_id = f"{key}.{n}"
        scope = step.scope or routine.scope
        work = Work(
            id=work_id,
            scope=scope,
            binding=step.binding,
            kind=step.kind,
            scheduled_by=firing_owner(routine.id),
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
            dependencies=Dependencies(after=[previous]),
        )
        first_input = Event(
            id=f"{work_id}/input", delivery_id=f"{work_id}/input", type=FIRE_INPUT_TYPE,
            payload=step.input, work_id=work_id, scope=scope, pending=True, accepted_at_ms=now_ms,
        )  # fmt: skip
        chained.append((work, first_input))
        previous = work_id
    return chained


def _fire_work(routine: Routine, key: str, now_ms: int) -> Work:
    """The new Work a fire of a Routine with a binding creates (its id is the fire key)."""
    template = routine.target
    assert template.binding is not None
    return Work(
        id=key,
        scope=template.scope or routine.scope,
        binding=template.binding,
        kind=template.kind,
        scheduled_by=firing_owner(routine.id),
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )


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


def fire_input_id(routine: Routine) -> str | None:
    """The id of the input the Routine's current fire delivered (``None``: no fire started)."""
    if routine.scheduled_for_ms is None:
        return None
    return f"{ledger.fire_key(routine.id, routine.scheduled_for_ms)}/input"


def settle_update(
    routine: Routine, work: Work | None, input_pending: bool, *, now_ms: int
) -> RoutineUpdate | None:
    """The outcome write that settles a ``running`` Routine whose fired Work (``None``: gone)
    is done; ``None`` while it is still pending."""
    token, work_id, scheduled = routine.claim_token, routine.fired_work_id, routine.scheduled_for_ms
    if routine.status is not RoutineStatus.RUNNING or token is None or scheduled is None:
        return None
    outcome: tuple[bool, str] | None
    if work is None:
        outcome = (False, f"fired work {work_id} no longer exists")
    else:
        outcome = fire_outcome(routine, work, input_pending)
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
        return RoutineUpdate(
            routine.id,
            lambda r: ledger.succeed_fire(r, token=token, spec=readable, now_ms=now_ms),
            run=run,
            events=[event],
        )
    event = routine_event(routine, "error", token, now_ms, work_id=work_id, error=detail)
    return RoutineUpdate(
        routine.id,
        lambda r: ledger.fail_fire(r, token=token, error=detail, now_ms=now_ms),
        run=run,
        events=[event],
    )


async def settle_fire(store: Store, routine: Routine, *, now_ms: int) -> Routine | None:
    """Settle a ``running`` Routine whose Work is done; ``None`` while it is still pending."""
    if routine.status is not RoutineStatus.RUNNING or routine.scheduled_for_ms is None:
        return None
    work: Work | None = None
    pending = False
    if routine.fired_work_id is not None:
        try:
            work = await store.get_work(routine.fired_work_id)
        except NotFoundError:
            work = None
    input_id = fire_input_id(routine)
    if work is not None and input_id is not None:
        try:
            pending = (await store.get_event(input_id)).pending
        except NotFoundError:
            pending = False
    update = settle_update(routine, work, pending, now_ms=now_ms)
    if update is None:
        return None
    return await _apply(store, update)


async def _apply(store: Store, update: RoutineUpdate) -> Routine | None:
    """A fenced outcome write; a stale token or a removed row means someone else moved on."""
    try:
        return await store.apply_routine(
            update.routine_id, update.change, run=update.run, events=update.events
        )
    except (StaleRoutineClaimError, IllegalTransitionError, NotFoundError) as exc:
        log.info("routine %s: outcome not written (%s)", update.routine_id, exc)
        return None
