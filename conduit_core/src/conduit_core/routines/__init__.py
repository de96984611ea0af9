"""Routines: cron occurrence math, the ledger state machine, and the unified schedule surface.

``occurrence`` is the cron math (over ``cronfields`` and ``cronwalk``); ``ledger`` holds pure
transitions the store applies inside its write transactions; ``fire`` turns a claimed Routine
into Work; ``ticker`` drives the ledger (no durable state); ``managed`` is the ``conduit``
schedule source and ``reconcile`` loads ``[[routines]]`` from config; ``sources`` and
``crontab`` make the schedule surface.
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
from conduit_core.routines.fire import (
    FireTarget,
    KeyFor,
    check_bound_owner,
    fired_by,
    firing_owner,
    is_fired_by_routine,
)
from conduit_core.routines.managed import ConduitRoutineSource, InvalidRoutineIdError, new_routine
from conduit_core.routines.occurrence import (
    MisfireDecision,
    Spec,
    misfire_next,
    parse_spec,
    validate_once_not_past,
)
from conduit_core.routines.reconcile import ReconcileReport, reconcile_routines
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
from conduit_core.routines.ticker import Ticker
from conduit_core.storage import RoutineRun

__all__ = [
    "BoundRecurringScheduleError",
    "ConduitRoutineSource",
    "CrontabLocation",
    "CrontabSource",
    "DomainViolationError",
    "DuplicateFiringOwnerError",
    "FireTarget",
    "KeyFor",
    "IllegalTransitionError",
    "InvalidCronSpecError",
    "InvalidRoutineIdError",
    "InvalidTimezoneError",
    "ManagedScheduleSource",
    "MergedRead",
    "MisfireDecision",
    "ReadOnlySourceError",
    "ReconcileReport",
    "RoutineBusyError",
    "RoutineRun",
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
    "Ticker",
    "check_bound_owner",
    "fired_by",
    "firing_owner",
    "is_fired_by_routine",
    "misfire_next",
    "new_routine",
    "parse_spec",
    "reconcile_routines",
    "routine_record",
    "validate_once_not_past",
]
