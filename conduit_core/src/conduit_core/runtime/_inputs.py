"""Input events: what the core accepts for a Work and what an executor is shown of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conduit_core.extension import InputEvent
from conduit_core.model import Event
from conduit_core.runtime._policy import MANUAL_RETRY_EVENT_TYPE, RETRY_EVENT_TYPE
from conduit_core.storage import Store

__all__ = ["input_event", "presented", "presented_inputs"]

INPUT_EVENT_TYPE = "input"

_RETRY_TYPES = frozenset({RETRY_EVENT_TYPE, MANUAL_RETRY_EVENT_TYPE})


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


async def presented_inputs(store: Store, inputs: Sequence[Event]) -> list[Event]:
    """The inputs an attempt sees: a retry event brings back the input it retries first."""
    shown: list[Event] = []
    for event in inputs:
        if event.type in _RETRY_TYPES and isinstance(event.payload, dict):
            trigger = event.payload.get("trigger") or []
            originals = [await store.get_event(i) for i in trigger if isinstance(i, str)]
            shown.extend(
                o for o in await presented_inputs(store, originals) if o.type not in _RETRY_TYPES
            )
        shown.append(event)
    return shown
