"""The records of Routine writes, shared by the Store contract and the Routine operations (a
leaf module: the contract names them without importing the operations)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from conduit_core.model import Event, Routine, Work

__all__ = ["BoundWorkCheck", "RoutineChange", "RoutineRun", "RoutineUpdate"]

#: A pure transition of one Routine row (may raise to refuse it; nothing is written then).
RoutineChange = Callable[[Routine], Routine]
#: Checks a new Routine against the existing Work it binds (``None`` when that Work is missing);
#: returns the Work to save (stamped with its firing owner) or ``None`` to leave it; raises to
#: refuse the Routine.
BoundWorkCheck = Callable[[Routine, Work | None], Work | None]


class RoutineRun(msgspec.Struct, frozen=True, kw_only=True):
    """One fire of a Routine: its occurrence, the Work it fed, and how it ended."""

    routine_id: str
    scheduled_for_ms: int
    work_id: str | None = None
    #: ``running``, ``completed``, ``failed`` or ``error`` (the fire itself could not dispatch).
    outcome: str
    error: str | None = None
    started_at_ms: int
    ended_at_ms: int | None = None


class RoutineUpdate(msgspec.Struct, frozen=True):
    """One ``apply_routine`` of a batch: the change, the run-history row, the events."""

    routine_id: str
    change: RoutineChange
    run: RoutineRun | None = None
    events: Sequence[Event] = ()
