"""The Routine ledger state machine: pure transitions over :class:`~conduit_core.model.Routine`.

The store calls these inside its write transaction on the freshly read row and writes back what
they return; they do no I/O and take ``now_ms`` from the caller. A refused transition raises
(``illegal_transition``, ``routine_busy``, ``stale_routine_claim``) and nothing is written.

::

    idle --(next_run_at <= now)--> queued --(claim)--> claimed --> running
    claimed --(misfire skip)--> idle                         running --> idle  (success, re-armed)
    claimed --(abandon)--> queued                            running --> error (failure, disarmed)
    idle | queued | error --(pause)--> paused      paused | error --(resume)--> idle (re-armed)

Every outcome write (start, skip, abandon, renew, success, failure) names the claim token it
holds; a token that is no longer the row's (a stale ticker) is refused.
"""

from __future__ import annotations

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Routine, RoutineStatus
from conduit_core.routines.errors import (
    IllegalTransitionError,
    InvalidCronSpecError,
    InvalidTimezoneError,
    RoutineBusyError,
    StaleRoutineClaimError,
)
from conduit_core.routines.occurrence import MisfireDecision, Spec, misfire_next, parse_spec

__all__ = [
    "abandon_claim",
    "claim",
    "edit_schedule",
    "fail_fire",
    "fire_key",
    "heal_on_boot",
    "is_due",
    "pause",
    "plan_fire",
    "queue_due",
    "renew_claim",
    "resume",
    "run_now",
    "skip_fire",
    "readable_spec",
    "spec_of",
    "start_fire",
    "succeed_fire",
]

S = RoutineStatus
_BUSY = (S.CLAIMED, S.RUNNING)


def spec_of(routine: Routine) -> Spec:
    """The parsed spec of ``routine`` (in its timezone)."""
    return parse_spec(routine.cron_spec, routine.timezone)


def readable_spec(routine: Routine) -> Spec | ConduitError:
    """:func:`spec_of`, or the coded error of a stored spec this version no longer reads (one
    stored before a rule tightened): the ticker halts such a Routine instead of failing."""
    try:
        return spec_of(routine)
    except (InvalidCronSpecError, InvalidTimezoneError) as exc:
        return exc


def fire_key(routine_id: str, scheduled_for_ms: int) -> str:
    """The idempotency key of one fire: a retried fire of the same occurrence reuses it."""
    return f"routine:{routine_id}:{scheduled_for_ms}"


def _refuse(routine: Routine, target: RoutineStatus, why: str = "") -> IllegalTransitionError:
    return IllegalTransitionError(routine.id, str(routine.status), str(target), why=why)


def _require(routine: Routine, target: RoutineStatus, *allowed: RoutineStatus) -> None:
    if routine.status not in allowed:
        names = "|".join(str(s) for s in allowed)
        raise _refuse(routine, target, f"only from {names}")


def _check_token(routine: Routine, token: str) -> None:
    if routine.claim_token is None or routine.claim_token != token:
        raise StaleRoutineClaimError(
            f"routine {routine.id!r}: claim token {token!r} is not the current claim "
            f"(status {routine.status}); a newer ticker owns this row"
        )


def _unclaimed(routine: Routine, status: RoutineStatus, now_ms: int, **changes: object) -> Routine:
    return msgspec.structs.replace(
        routine,
        status=status,
        claim_owner=None,
        claim_token=None,
        claim_expires_at_ms=None,
        updated_at_ms=now_ms,
        **changes,
    )


# --- Ticker path ----------------------------------------------------------------------------


def is_due(routine: Routine, now_ms: int) -> bool:
    """Whether the due-pass queues this row: idle, armed, and ``next_run_at <= now``."""
    return (
        routine.status is S.IDLE
        and routine.next_run_at_ms is not None
        and routine.next_run_at_ms <= now_ms
    )


def queue_due(routine: Routine, now_ms: int) -> Routine:
    """idle -> queued, only for a due row (armed, ``next_run_at <= now``)."""
    _require(routine, S.QUEUED, S.IDLE)
    if not is_due(routine, now_ms):
        raise _refuse(routine, S.QUEUED, "not due (next_run_at is null or in the future)")
    return msgspec.structs.replace(routine, status=S.QUEUED, updated_at_ms=now_ms)


def claim(routine: Routine, *, owner: str, token: str, now_ms: int, lease_ms: int) -> Routine:
    """queued -> claimed under a claim lease. A refusal is a lost race: drop, never retry."""
    _require(routine, S.CLAIMED, S.QUEUED)
    return msgspec.structs.replace(
        routine,
        status=S.CLAIMED,
        claim_owner=owner,
        claim_token=token,
        claim_expires_at_ms=now_ms + lease_ms,
        updated_at_ms=now_ms,
    )


def plan_fire(routine: Routine, spec: Spec, now_ms: int) -> MisfireDecision:
    """The misfire decision for a claimed row, from its ``next_run_at`` and policy."""
    scheduled = routine.next_run_at_ms if routine.next_run_at_ms is not None else now_ms
    grace_ms = round(routine.grace_seconds * 1000)
    return misfire_next(spec, scheduled, now_ms, routine.misfire, grace_ms)


def start_fire(
    routine: Routine, *, token: str, scheduled_for_ms: int, fired_work_id: str | None, now_ms: int
) -> Routine:
    """claimed -> running for the occurrence ``scheduled_for_ms``."""
    _check_token(routine, token)
    _require(routine, S.RUNNING, S.CLAIMED)
    return msgspec.structs.replace(
        routine,
        status=S.RUNNING,
        scheduled_for_ms=scheduled_for_ms,
        fired_work_id=fired_work_id,
        last_run_at_ms=now_ms,
        updated_at_ms=now_ms,
    )


def skip_fire(routine: Routine, *, token: str, next_run_at_ms: int | None, now_ms: int) -> Routine:
    """claimed -> idle without firing (misfire ``skip``), re-armed at ``next_run_at_ms``."""
    _check_token(routine, token)
    _require(routine, S.IDLE, S.CLAIMED)
    return _unclaimed(routine, S.IDLE, now_ms, next_run_at_ms=next_run_at_ms)


def abandon_claim(routine: Routine, *, token: str, now_ms: int) -> Routine:
    """claimed -> queued: the claimant gives the fire back before starting it."""
    _check_token(routine, token)
    _require(routine, S.QUEUED, S.CLAIMED)
    return _unclaimed(routine, S.QUEUED, now_ms)


def renew_claim(routine: Routine, *, token: str, now_ms: int, lease_ms: int) -> Routine:
    """Extend the claim lease of a claimed or running row; never shortens it."""
    _check_token(routine, token)
    if routine.status not in _BUSY:
        raise _refuse(routine, routine.status, "only a claimed or running row holds a claim")
    expires = max(routine.claim_expires_at_ms or 0, now_ms + lease_ms)
    return msgspec.structs.replace(routine, claim_expires_at_ms=expires, updated_at_ms=now_ms)


def succeed_fire(routine: Routine, *, token: str, spec: Spec, now_ms: int) -> Routine:
    """running -> idle, re-armed at the next occurrence after the scheduled time.

    A spent one-shot goes idle with a null ``next_run_at`` (quiet). A lost claim on a bound Work
    counts as success.
    """
    _check_token(routine, token)
    _require(routine, S.IDLE, S.RUNNING)
    anchor = routine.scheduled_for_ms if routine.scheduled_for_ms is not None else now_ms
    return _unclaimed(
        routine,
        S.IDLE,
        now_ms,
        next_run_at_ms=spec.next_after(anchor),
        scheduled_for_ms=None,
        last_error=None,
    )


def fail_fire(routine: Routine, *, token: str, error: str, now_ms: int) -> Routine:
    """claimed | running -> error, disarmed (error-halts) until a person resumes it (a claimed
    row fails when its stored spec can no longer be read)."""
    _check_token(routine, token)
    _require(routine, S.ERROR, S.RUNNING, S.CLAIMED)
    return _unclaimed(
        routine, S.ERROR, now_ms, next_run_at_ms=None, scheduled_for_ms=None, last_error=error
    )


# --- Operator path --------------------------------------------------------------------------


def pause(routine: Routine, now_ms: int) -> Routine:
    """idle | queued | error -> paused (idempotent on paused); refused while a fire runs."""
    if routine.status is S.PAUSED:
        return routine
    if routine.status in _BUSY:
        raise RoutineBusyError(routine.id, str(routine.status), str(S.PAUSED), why="fire in flight")
    _require(routine, S.PAUSED, S.IDLE, S.QUEUED, S.ERROR)
    return msgspec.structs.replace(
        routine, status=S.PAUSED, next_run_at_ms=None, updated_at_ms=now_ms
    )


def resume(routine: Routine, spec: Spec, now_ms: int) -> Routine:
    """paused | error -> idle, re-armed at the next future occurrence (none: quiet)."""
    if routine.status in _BUSY:
        raise RoutineBusyError(routine.id, str(routine.status), str(S.IDLE), why="fire in flight")
    _require(routine, S.IDLE, S.PAUSED, S.ERROR)
    return msgspec.structs.replace(
        routine, status=S.IDLE, next_run_at_ms=spec.next_after(now_ms), updated_at_ms=now_ms
    )


def run_now(routine: Routine, now_ms: int) -> Routine:
    """Arm an idle row to fire at ``now`` (then poke the ticker); a queued row is already due."""
    if routine.status in _BUSY:
        raise RoutineBusyError(routine.id, str(routine.status), str(S.QUEUED), why="fire in flight")
    if routine.status is S.QUEUED:
        return routine
    _require(routine, S.QUEUED, S.IDLE)
    return msgspec.structs.replace(routine, next_run_at_ms=now_ms, updated_at_ms=now_ms)


def edit_schedule(
    routine: Routine, *, cron_spec: str, timezone: str, spec: Spec, now_ms: int
) -> Routine:
    """Change the spec; an idle or queued row goes idle re-armed on the new spec.

    Paused and errored rows keep their status (``resume`` re-arms them). Refused while a fire runs.
    """
    if routine.status in _BUSY:
        raise RoutineBusyError(
            routine.id, str(routine.status), str(routine.status), why="fire in flight"
        )
    if routine.status in (S.PAUSED, S.ERROR):
        return msgspec.structs.replace(
            routine, cron_spec=cron_spec, timezone=timezone, updated_at_ms=now_ms
        )
    return msgspec.structs.replace(
        routine,
        status=S.IDLE,
        cron_spec=cron_spec,
        timezone=timezone,
        next_run_at_ms=spec.next_after(now_ms),
        updated_at_ms=now_ms,
    )


# --- Boot-resume ----------------------------------------------------------------------------


def heal_on_boot(routine: Routine, spec: Spec | ConduitError, now_ms: int) -> Routine | None:
    """Heal a row left mid-fire by a dead ticker; ``None`` leaves it as it is.

    Only a claimed or running row whose claim lease has EXPIRED is healed (a live lease belongs to
    another daemon): claimed -> queued (it was due: fire it now); recurring running -> idle at the
    next occurrence after its scheduled time; one-shot running -> error (its outcome is unknown and
    re-firing risks running it twice: a person inspects it).
    """
    if routine.status not in _BUSY:
        return None
    expires = routine.claim_expires_at_ms
    if expires is not None and expires > now_ms:
        return None
    if routine.status is S.CLAIMED:
        return _unclaimed(routine, S.QUEUED, now_ms)
    if isinstance(spec, ConduitError):
        return _unclaimed(
            routine,
            S.ERROR,
            now_ms,
            next_run_at_ms=None,
            last_error=f"fire interrupted and the stored spec cannot be read: {spec.message}",
        )
    if spec.is_recurring:
        anchor = routine.scheduled_for_ms if routine.scheduled_for_ms is not None else now_ms
        return _unclaimed(
            routine, S.IDLE, now_ms, next_run_at_ms=spec.next_after(anchor), scheduled_for_ms=None
        )
    return _unclaimed(
        routine,
        S.ERROR,
        now_ms,
        next_run_at_ms=None,
        last_error="one-shot fire interrupted (claim lease expired); outcome unknown, not re-fired",
    )
