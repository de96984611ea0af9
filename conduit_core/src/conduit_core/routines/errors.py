"""Errors of Routines and the schedule surface, each with a stable ``code`` and an HTTP status.

``http_status`` is what the HTTP API answers for the error; the CLI and scripts use ``code``.
"""

from __future__ import annotations

from typing import ClassVar

from conduit_core.errors import ConduitError, NotFoundError

__all__ = [
    "BoundRecurringScheduleError",
    "DomainViolationError",
    "DuplicateFiringOwnerError",
    "IllegalTransitionError",
    "InvalidCronSpecError",
    "InvalidTimezoneError",
    "ReadOnlySourceError",
    "RoutineBusyError",
    "ScheduleNotFoundError",
    "SourceUnavailableError",
    "StaleRoutineClaimError",
]


class InvalidCronSpecError(ConduitError):
    """A cron spec that cannot be used; the message names the problem (and the field)."""

    code = "invalid_cron_spec"
    http_status: ClassVar[int] = 400


class InvalidTimezoneError(ConduitError):
    """A timezone that is not a known IANA zone name."""

    code = "invalid_timezone"
    http_status: ClassVar[int] = 400


class BoundRecurringScheduleError(ConduitError):
    """A recurring spec bound to an existing Work (a bound Routine may only be a one-shot)."""

    code = "bound_recurring_schedule"
    http_status: ClassVar[int] = 400


class IllegalTransitionError(ConduitError):
    """A Routine transition its current status does not allow; names from and to."""

    code = "illegal_transition"
    http_status: ClassVar[int] = 409

    def __init__(self, routine_id: str, current: str, target: str, *, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(
            f"routine {routine_id!r}: illegal transition {current} -> {target}{detail}"
        )
        self.routine_id = routine_id
        self.current = current
        self.target = target


class RoutineBusyError(IllegalTransitionError):
    """Pause, resume or edit refused while a fire is claimed or running."""

    code = "routine_busy"


class StaleRoutineClaimError(ConduitError):
    """An outcome write whose claim token is not the row's current one (a stale ticker)."""

    code = "stale_routine_claim"
    http_status: ClassVar[int] = 409


class DuplicateFiringOwnerError(ConduitError):
    """The target Work already has a different non-manual firing owner."""

    code = "duplicate_firing_owner"
    http_status: ClassVar[int] = 409


class ReadOnlySourceError(ConduitError):
    """A write aimed at an observe-only schedule source."""

    code = "read_only_source"
    http_status: ClassVar[int] = 403


class DomainViolationError(ConduitError):
    """A conduit-domain schedule aimed at an external source (or the reverse)."""

    code = "domain_violation"
    http_status: ClassVar[int] = 422


class SourceUnavailableError(ConduitError):
    """A write aimed at a schedule source that is down."""

    code = "source_unavailable"
    http_status: ClassVar[int] = 503


class ScheduleNotFoundError(NotFoundError):
    """No source holds a schedule with this id."""

    http_status: ClassVar[int] = 404

    def __init__(self, ident: str) -> None:
        super().__init__("schedule", ident)
