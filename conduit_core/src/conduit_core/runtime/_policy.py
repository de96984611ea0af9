"""Pure outcome policy: what a finished attempt does to its Work, timers and events.

Nothing here does I/O. These functions run inside the store's fenced ``settle_attempt``
transaction, on the attempt and Work as freshly read there, and decide its :class:`Transition`
(the store's ``Settlement``). Anything that calls a plugin (retry hints) is decided before.
"""

from __future__ import annotations

import msgspec

from conduit_core.extension import OutcomeKind, Result, RetryHint
from conduit_core.model import (
    Event,
    Execution,
    ExecutionStatus,
    Timer,
    TimerKind,
    Wait,
    Work,
    WorkKind,
    WorkStatus,
)
from conduit_core.storage import AttemptEnd, Settlement

__all__ = [
    "HINT_MARGIN_MS",
    "MAX_HINT_DELAY_MS",
    "UNKNOWN_RESET_DELAY_MS",
    "Transition",
    "completion",
    "failure",
    "hint_delay_ms",
    "parking",
    "turn_events",
]

#: A hint with a known reset retries two minutes after it.
HINT_MARGIN_MS = 2 * 60_000
#: A hint with an unknown reset retries after thirty minutes.
UNKNOWN_RESET_DELAY_MS = 30 * 60_000
#: A hint further out than this is refused as excessive.
MAX_HINT_DELAY_MS = 7 * 24 * 3_600_000

TURN_EVENT_TYPE = "core.execution.turn"
TURN_SCHEMA = "core.execution.turn.v1"
RETRY_EVENT_TYPE = "core.retry"
MANUAL_RETRY_EVENT_TYPE = "core.manual.retry"


#: Everything one attempt-ending transaction writes (the store's settlement).
Transition = Settlement


class HintRefused(ValueError):
    """An invalid, past or excessive retry hint; the failure is recorded without it."""


def hint_delay_ms(hint: RetryHint, now_ms: int) -> int:
    """The delay a retry hint asks for; raises :class:`HintRefused` for a bad one."""
    if hint.unknown_reset:
        return UNKNOWN_RESET_DELAY_MS
    if hint.reset_at_ms is None:
        raise HintRefused("retry hint has neither reset_at_ms nor unknown_reset")
    if hint.reset_at_ms < now_ms:
        raise HintRefused(f"retry hint reset {hint.reset_at_ms} is in the past")
    delay = hint.reset_at_ms - now_ms + HINT_MARGIN_MS
    if delay > MAX_HINT_DELAY_MS:
        raise HintRefused(f"retry hint asks for {delay} ms, over the {MAX_HINT_DELAY_MS} ms limit")
    return delay


def completion(execution: Execution, work: Work, result: Result, now_ms: int) -> Transition:
    """A completed (or handed-off) attempt: exclusion is established by the observed result."""
    handoff = result.outcome is OutcomeKind.HANDOFF
    status = ExecutionStatus.HANDOFF if handoff else ExecutionStatus.COMPLETED

    def change(current: Work) -> Work:
        done = _completes_work(current, result.outcome)
        return msgspec.structs.replace(
            current,
            # Completed Work never overtakes accepted input that no attempt has seen yet.
            status=WorkStatus.COMPLETED
            if done and current.pending_inputs == 0
            else WorkStatus.READY,
            failure_count=0,
            blocked_reason=None,
        )

    return Transition(
        end=AttemptEnd(status=status, result=result, exclusion_confirmed=True),
        work=change,
        publish=turn_events(execution, work, result, now_ms),
    )


def _completes_work(work: Work, outcome: OutcomeKind) -> bool:
    if work.kind is WorkKind.STANDING:
        return False
    if outcome is OutcomeKind.HANDOFF:
        return work.kind is WorkKind.RUN_ONCE
    return True


def failure(
    execution: Execution,
    work: Work,
    *,
    now_ms: int,
    code: str,
    message: str,
    result: Result | None = None,
    permanent: bool = False,
    hint: RetryHint | None = None,
    status: ExecutionStatus = ExecutionStatus.FAILED,
    exclusion_confirmed: bool = False,
) -> Transition:
    """A failed (or timed-out) attempt: count the failure and arm a retry, or exhaust."""
    policy = execution.snapshot.retry_policy
    delays_ms = [int(d * 1000) for d in policy.delays_seconds]
    failures = work.failure_count + 1
    delay: int | None = None
    refusal: str | None = None
    if hint is not None and not permanent:
        try:
            delay = hint_delay_ms(hint, now_ms)
        except HintRefused as exc:
            refusal = str(exc)
    blocked: str | None = None
    standing = work.kind is WorkKind.STANDING
    if permanent:
        blocked = "permanent_failure"
    elif delay is not None:
        # A hint's delay does not index the failure-budget delays, and standing Work with a
        # hint backs off without exhausting.
        if not standing and failures > len(delays_ms):
            blocked, delay = "retry_exhausted", None
    elif standing:
        delay = None  # a hintless failure of standing Work arms nothing
    elif failures <= len(delays_ms):
        delay = delays_ms[failures - 1]
    else:
        blocked = "retry_exhausted"

    timers: list[Timer] = []
    timer_id: str | None = None
    if delay is not None:
        timer_id = f"retry/{execution.id}"
        timers.append(
            Timer(
                id=timer_id,
                kind=TimerKind.RETRY,
                due_at_ms=now_ms + delay,
                work_id=work.id,
                execution_id=execution.id,
                generation=failures,
                payload={"attempt": execution.attempt, "trigger": list(execution.inputs)},
            )
        )
    terminal = blocked is not None and policy.terminal_on_exhaustion

    def change(current: Work) -> Work:
        return msgspec.structs.replace(
            current,
            status=WorkStatus.FAILED if terminal else WorkStatus.READY,
            failure_count=failures,
            blocked_reason=blocked,
            retry_timer_id=timer_id,
        )

    text = message if refusal is None else f"{message} (retry hint refused: {refusal})"
    return Transition(
        end=AttemptEnd(
            status=status,
            result=result,
            failure_code=code,
            failure_message=text,
            exclusion_confirmed=exclusion_confirmed,
        ),
        work=change,
        arm=timers,
        publish=turn_events(execution, work, result, now_ms),
    )


def parking(execution: Execution, work: Work, result: Result, now_ms: int) -> Transition:
    """A ``waiting`` result parks the attempt on a wait, with its remaining timeout budget."""
    assert result.wait is not None
    timers: list[Timer] = []
    timer_id: str | None = None
    if result.wait.timeout_seconds is not None:
        timer_id = f"wait/{execution.id}/{execution.epoch}"
        timers.append(
            Timer(
                id=timer_id,
                kind=TimerKind.WAIT_TIMEOUT,
                due_at_ms=now_ms + int(result.wait.timeout_seconds * 1000),
                work_id=execution.work_id,
                execution_id=execution.id,
            )
        )
    wait = Wait(
        execution_id=execution.id,
        work_id=execution.work_id,
        event_type=result.wait.event_type,
        correlation_key=result.wait.correlation_key,
        timer_id=timer_id,
        created_at_ms=now_ms,
    )
    remaining = max(execution.snapshot.deadline_ms - now_ms, 0)

    def change(current: Work) -> Work:
        return msgspec.structs.replace(current, status=WorkStatus.WAITING)

    return Transition(
        end=AttemptEnd(
            status=ExecutionStatus.PARKED,
            result=result,
            exclusion_confirmed=True,
            remaining_budget_ms=remaining,
        ),
        work=change,
        arm=timers,
        wait=wait,
        publish=turn_events(execution, work, result, now_ms),
    )


def turn_events(
    execution: Execution, work: Work, result: Result | None, now_ms: int
) -> list[Event]:
    """``core.execution.turn`` events for a result that declares a turn: one per key.

    Recorded unmatched (never input); delivery ``turn/<execution>/<epoch>[/<key>]`` makes a
    repeated transition a no-op and a resumed attempt's next turn a new Event.
    """
    if result is None or result.turn is None:
        return []
    keys = work.correlation_keys
    base = f"turn/{execution.id}/{execution.epoch}"
    payload = {
        "schema": TURN_SCHEMA,
        "status": result.turn.status,
        "comment": result.turn.comment,
        "work": execution.work_id,
        "execution": execution.id,
    }
    return [
        Event(
            id=delivery,
            delivery_id=delivery,
            type=TURN_EVENT_TYPE,
            payload=payload,
            correlation_key=key,
            scope=execution.scope,
            published_by=execution.id,
            unmatched=True,
            accepted_at_ms=now_ms,
        )
        for key, delivery in ([(k, f"{base}/{k}") for k in keys] if keys else [(None, base)])
    ]
