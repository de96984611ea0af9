"""Input events: what the core accepts for a Work and what an executor is shown of it."""

from __future__ import annotations

from typing import Any

from conduit_core.extension import InputEvent
from conduit_core.model import Event

__all__ = ["input_event", "presented"]

INPUT_EVENT_TYPE = "input"


def input_event(
    work_id: str,
    payload: Any,
    *,
    delivery_id: str,
    now: int,
    event_type: str = INPUT_EVENT_TYPE,
    correlation_key: str | None = None,
) -> Event:
    """Input addressed to a Work; ``delivery_id`` makes its acceptance idempotent."""
    return Event(
        id=delivery_id,
        delivery_id=delivery_id,
        type=event_type,
        payload=payload,
        work_id=work_id,
        correlation_key=correlation_key,
        pending=True,
        accepted_at_ms=now,
    )


def presented(event: Event) -> InputEvent:
    """The part of an accepted event an executor sees."""
    return InputEvent(
        id=event.id,
        type=event.type,
        payload=event.payload,
        correlation_key=event.correlation_key,
        accepted_at_ms=event.accepted_at_ms,
    )
