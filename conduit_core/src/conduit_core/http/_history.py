"""A Work's history, built from what the store already records.

Sources, each read as it is stored (nothing here is kept twice):

- the Work row: when it was created (and by which Routine);
- the events addressed to the Work (``Store.work_events``): its inputs, the gate and budget holds
  and their settling (with the reason given), retry timers that fired, manual retries (with the
  reason), people's stop confirmations (``by``, reason), and the audit records the API writes for
  a cancel and an interrupt (:data:`CANCELLED`, :data:`INTERRUPTED`: with the reason; before them
  a cancel's reason was only logged);
- the attempts (``Store.list_executions``): start and end with their outcome, each segment
  (``recovered`` / ``relaunched``), each launch phase, the retry armed after a failure.

**Who**: an entry's ``actor`` is read from the record (``actor`` in an event's payload, ``by`` for a
stop confirmation); where nothing records who, it is ``None`` (the console shows "—").
:func:`recorded_actor` is the one place that reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from conduit_core.model import Event, Execution, Work

__all__ = [
    "CANCELLED",
    "INTERRUPTED",
    "HistoryEntry",
    "HistoryPage",
    "recorded_actor",
    "build_history",
]

#: Audit records the API writes (control events addressed to the Work: history, never input).
CANCELLED = "core.work.cancelled"
INTERRUPTED = "core.work.interrupted"

#: Event type → (entry kind, what it says); anything else addressed to the Work is an input.
_CONTROL_EVENTS = {
    "core.gate.held": ("gate_held", "held by start gate"),
    "core.gate.released": ("gate_approved", "approved (gate released)"),
    "core.gate.refused": ("gate_refused", "refused (gate refused: Work cancelled)"),
    "core.budget.held": ("budget_held", "held by budget"),
    "core.budget.released": ("budget_released", "budget hold released"),
    "core.retry": ("retry_fired", "retry timer fired: the Work may start again"),
    "core.manual.retry": ("manual_retry", "manual retry"),
    "core.execution.stop_confirmed": ("stop_confirmed", "stop confirmed by a person"),
    "core.work.dependency_failed": ("dependency_failed", "a dependency did not complete"),
    CANCELLED: ("cancelled", "cancelled"),
    INTERRUPTED: ("interrupted", "interrupt requested"),
}


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened to the Work."""

    at_ms: int
    #: ``created``, ``input``, ``gate_held``, ``gate_approved``, ``gate_refused``,
    #: ``budget_held``, ``budget_released``, ``attempt_started``, ``segment``, ``phase``,
    #: ``attempt_ended``, ``retry_armed``, ``retry_fired``, ``manual_retry``, ``cancelled``,
    #: ``interrupted``, ``stop_confirmed``, ``recovery_held``, ``dependency_failed``.
    kind: str
    summary: str
    #: Who did it, where the record says (the token's name, a gate, ``console``); else ``None``.
    actor: str | None = None
    reason: str | None = None
    attempt: int | None = None
    #: The record it comes from: an event id or an attempt id.
    ref: str | None = None


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    work_id: str
    items: list[HistoryEntry]
    #: Entries in all (the page is ``items``); ``next``: the ``after`` of the next page.
    total: int
    next: str | None = None


def recorded_actor(payload: Any) -> str | None:
    """Who the record says did it: ``actor`` (a token's name), else ``by``; ``None`` when no one
    is recorded. Actions write their token's name as ``actor`` (``http._tokens.actor_of``)."""
    if not isinstance(payload, dict):
        return None
    for key in ("actor", "by"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _reason(payload: Any) -> str | None:
    if isinstance(payload, dict):
        value = payload.get("reason")
        if isinstance(value, str) and value:
            return value
    return None


def _event_entry(event: Event, consumed_by: dict[str, int]) -> HistoryEntry:
    payload = event.payload
    known = _CONTROL_EVENTS.get(event.type)
    if known is None:
        taken = consumed_by.get(event.id)
        where = "pending" if event.pending else (
            f"taken by attempt {taken}" if taken is not None else "not taken"
        )  # fmt: skip
        return HistoryEntry(
            at_ms=event.accepted_at_ms, kind="input", summary=f"input {event.type} ({where})",
            actor=recorded_actor(payload) or event.actor, attempt=taken, ref=event.id,
        )  # fmt: skip
    kind, text = known
    attempt = None
    if isinstance(payload, dict):
        if kind in ("gate_held", "gate_approved", "gate_refused") and payload.get("gate"):
            text = f"{text} {payload['gate']!s}"
        elif kind == "budget_held" and payload.get("budget"):
            text = f"{text} {payload['budget']!s}"
        elif kind == "retry_fired" and isinstance(payload.get("attempt"), int):
            attempt = payload["attempt"]
            text = f"retry timer fired after attempt {attempt}: the Work may start again"
        elif kind == "dependency_failed":
            then = "cancelled" if payload.get("policy") == "cancel" else "held for a person"
            text = (
                f"work {payload.get('dependency')} ended {payload.get('dependency_status')}: "
                f"{then}"
            )
        elif kind == "stop_confirmed":
            text = f"stop confirmed for epoch {payload.get('epoch')} ({payload.get('execution')})"
    return HistoryEntry(
        at_ms=event.accepted_at_ms, kind=kind, summary=text,
        actor=recorded_actor(payload) or event.actor, reason=_reason(payload), attempt=attempt,
        ref=event.id,
    )  # fmt: skip


def _attempt_entries(
    ex: Execution, armed: set[str], current_timer: str | None
) -> list[HistoryEntry]:
    n = ex.attempt
    out = [
        HistoryEntry(
            at_ms=ex.started_at_ms, kind="attempt_started", attempt=n, ref=ex.id,
            summary=f"attempt {n} started on {ex.snapshot.executor}@"
            f"{ex.snapshot.executor_generation} ({len(ex.inputs)} input(s))",
        )
    ]  # fmt: skip
    for index, seg in enumerate(ex.segments):
        flags = (("recovered", seg.recovered), ("relaunched", seg.relaunched))
        marks = [mark for mark, on in flags if on]
        if index > 0 or marks:
            what = " and ".join(marks) or "resumed"
            out.append(HistoryEntry(
                at_ms=seg.started_at_ms, kind="segment", attempt=n, ref=ex.id,
                summary=f"attempt {n} {what} at epoch {seg.epoch}",
            ))  # fmt: skip
        for phase in seg.launch:
            outcome = phase.outcome or "under way"
            out.append(HistoryEntry(
                at_ms=phase.started_at_ms, kind="phase", attempt=n, ref=ex.id,
                summary=f"attempt {n} launch phase {phase.name}: {outcome}",
            ))  # fmt: skip
    if ex.recovery_hold is not None:
        hold = ex.recovery_hold
        out.append(HistoryEntry(
            at_ms=hold.since_ms, kind="recovery_held", attempt=n, ref=ex.id, reason=hold.message,
            summary=f"attempt {n} recovery held ({hold.code}); settle: {hold.settle}",
        ))  # fmt: skip
    if ex.ended_at_ms is not None:
        failure = f" ({ex.failure_code}: {ex.failure_message})" if ex.failure_code else ""
        unverified = "" if ex.exclusion_confirmed else "; its stop is not verified yet"
        out.append(HistoryEntry(
            at_ms=ex.ended_at_ms, kind="attempt_ended", attempt=n, ref=ex.id,
            summary=f"attempt {n} ended {ex.status}{failure}{unverified}",
        ))  # fmt: skip
        timer = f"retry/{ex.id}"
        if timer in armed or timer == current_timer:
            out.append(HistoryEntry(
                at_ms=ex.ended_at_ms, kind="retry_armed", attempt=n, ref=ex.id,
                summary=f"retry armed after attempt {n}"
                + (" (waiting for its delay)" if timer == current_timer else ""),
            ))  # fmt: skip
    return out


def build_history(
    work: Work, executions: Sequence[Execution], events: Sequence[Event]
) -> list[HistoryEntry]:
    """Every entry, oldest first (ties keep the order above: the record's own order)."""
    consumed_by = {event_id: ex.attempt for ex in executions for event_id in ex.inputs}
    # A fired retry timer's event id is ``retry-event/retry/<execution>/<generation>``.
    armed = {
        e.id.removeprefix("retry-event/").rsplit("/", 1)[0] for e in events
        if e.type == "core.retry" and e.id.startswith("retry-event/")
    }  # fmt: skip
    entries = [
        HistoryEntry(
            at_ms=work.created_at_ms, kind="created", ref=work.id,
            summary=f"created for binding {work.binding} in scope {work.scope} "
            f"(scheduled by {work.scheduled_by})",
            actor=work.scheduled_by if work.scheduled_by != "manual" else None,
        )
    ]  # fmt: skip
    entries.extend(_event_entry(e, consumed_by) for e in events)
    for ex in executions:
        entries.extend(_attempt_entries(ex, armed, work.retry_timer_id))
    order = {id(entry): index for index, entry in enumerate(entries)}
    entries.sort(key=lambda entry: (entry.at_ms, order[id(entry)]))
    return entries


def page_of(
    work_id: str, entries: list[HistoryEntry], *, limit: int, after: str | None, newest: bool
) -> HistoryPage:
    """One page; ``after`` is the previous page's ``next`` (a position in the ordered list)."""
    from conduit_core.errors import ConduitError

    ordered = list(reversed(entries)) if newest else entries
    start = 0
    if after is not None:
        if not after.isdigit():
            raise ConduitError(f"query parameter 'after': {after!r} is not a page's next",
                               code="invalid_query")  # fmt: skip
        start = int(after)
    items = ordered[start : start + limit]
    following = start + limit
    return HistoryPage(
        work_id=work_id, items=items, total=len(entries),
        next=str(following) if following < len(ordered) else None,
    )  # fmt: skip
