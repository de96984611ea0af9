"""Interrupts and inject settlements as synchronous operations inside one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from conduit_core.model import (
    ControlIntent,
    ControlKind,
    ControlStatus,
    Execution,
    ExecutionStatus,
    WorkStatus,
)
from conduit_core.storage._contract import NotEligibleError
from conduit_core.storage._ops_misc import create_control
from conduit_core.storage._sql import (
    EVENTS_READ,
    STILL_PENDING,
    Codec,
    Cx,
    close_open_segment,
    dump,
    first,
    load_work,
    save_execution,
    save_work,
    stored_event,
)

__all__ = ["drop_inputs", "interrupt_work", "settle_consumed"]


def interrupt_work(
    cx: Cx, work_id: str, intent_id: str, now_ms: int, actor: str | None = None
) -> ControlIntent:
    """Fence the Work's live attempt and leave the Work ready, recording an interrupt intent.

    The attempt keeps its resource hold (exclusion unconfirmed) until the interrupt's stop is
    verified; the intent is what a dispatcher sends to the pinned executor.
    """
    work = load_work(cx, work_id)
    row = first(cx, "SELECT data FROM conduit_execution WHERE work_id = ? AND live = 1", (work_id,))
    if row is None:
        raise NotEligibleError(f"work {work_id!r} has no running attempt to interrupt")
    ex: Execution = Codec.execution.decode(row[0])
    fenced = msgspec.structs.replace(
        ex,
        status=ExecutionStatus.CANCELLED,
        failure_code="interrupted",
        failure_message="interrupted by an operator",
        segments=close_open_segment(ex, now_ms),
        ended_at_ms=now_ms,
        exclusion_confirmed=False,
    )
    save_execution(cx, fenced)  # ends the attempt: drops its lease
    if not work.status.terminal:
        save_work(cx, msgspec.structs.replace(work, status=WorkStatus.READY, updated_at_ms=now_ms))
    return create_control(
        cx,
        ControlIntent(
            id=intent_id,
            work_id=work_id,
            execution_id=ex.id,
            epoch=ex.epoch,
            kind=ControlKind.INTERRUPT,
            fallback=ex.snapshot.control_fallback,
            created_at_ms=now_ms,
            actor=actor,
        ),
    )


def settle_consumed(
    cx: Cx, execution_id: str, input_ids: Sequence[str], now_ms: int
) -> list[ControlIntent]:
    """A result's consumed inputs settle the attempt's open inject intents for them as consumed,
    whatever their dispatch state, and leave those inputs no longer pending."""
    consumed = set(input_ids)
    settled: list[ControlIntent] = []
    rows = cx.rows("SELECT data FROM conduit_control WHERE open = 1")
    for (data,) in rows:
        intent: ControlIntent = Codec.control.decode(data)
        if (
            intent.execution_id != execution_id
            or intent.kind is not ControlKind.INJECT
            or not set(intent.input_ids) <= consumed
        ):
            continue
        intent = msgspec.structs.replace(
            intent, status=ControlStatus.CONSUMED, settled_at_ms=now_ms
        )
        cx.run(
            "UPDATE conduit_control SET status = ?, open = 0, data = ? WHERE id = ?",
            (str(intent.status), dump(intent), intent.id),
        )
        drop_inputs(cx, intent.work_id, intent.input_ids)
        settled.append(intent)
    return settled


def drop_inputs(cx: Cx, work_id: str, input_ids: Sequence[str]) -> int:
    """Take inputs out of the Work's pending queue (consumed, or dropped by a control)."""
    dropped = 0
    for event_id in input_ids:
        row = first(cx, EVENTS_READ + f"WHERE e.id = ? AND {STILL_PENDING}", (event_id,))
        if row is None:
            continue
        event = msgspec.structs.replace(stored_event(row), pending=False)
        cx.run(
            "UPDATE conduit_event SET pending = 0, data = ? WHERE id = ?", (dump(event), event_id)
        )
        dropped += 1
    if dropped:
        work = load_work(cx, work_id, lock=True)
        save_work(
            cx,
            msgspec.structs.replace(work, pending_inputs=max(work.pending_inputs - dropped, 0)),
        )
    return dropped
