"""Routines: cron occurrence math, the ledger state machine, and the unified schedule surface.

``occurrence`` is the only module of conduit that imports croniter; ``ledger`` holds pure
transitions the store applies inside its write transactions; ``sources`` and ``crontab`` make the
schedule surface.
"""

from conduit_core.routines.crontab import CrontabLocation, CrontabSource
from conduit_core.routines.errors import (
    BoundRecurringScheduleError,
    DomainViolationError,
    DuplicateFiringOwnerError,
    IllegalTransitionError,
    InvalidCronSpecError,
    InvalidTimezoneError,
    ReadOnlySourceError,
    RoutineBusyError,
    ScheduleNotFoundError,
    SourceUnavailableError,
    StaleRoutineClaimError,
)
from conduit_core.routines.occurrence import (
    MisfireDecision,
    Spec,
    misfire_next,
    parse_spec,
    validate_once_not_past,
)
from conduit_core.routines.sources import (
    ManagedScheduleSource,
    MergedRead,
    ScheduleChange,
    ScheduleCreate,
    ScheduleMultiplexer,
    ScheduleRecord,
    ScheduleSource,
    SourceRead,
    SourceStatus,
    routine_record,
)

__all__ = [
    "BoundRecurringScheduleError",
    "CrontabLocation",
    "CrontabSource",
    "DomainViolationError",
    "DuplicateFiringOwnerError",
    "IllegalTransitionError",
    "InvalidCronSpecError",
    "InvalidTimezoneError",
    "ManagedScheduleSource",
    "MergedRead",
    "MisfireDecision",
    "ReadOnlySourceError",
    "RoutineBusyError",
    "ScheduleChange",
    "ScheduleCreate",
    "ScheduleMultiplexer",
    "ScheduleNotFoundError",
    "ScheduleRecord",
    "ScheduleSource",
    "SourceRead",
    "SourceStatus",
    "SourceUnavailableError",
    "Spec",
    "StaleRoutineClaimError",
    "misfire_next",
    "parse_spec",
    "routine_record",
    "validate_once_not_past",
]
