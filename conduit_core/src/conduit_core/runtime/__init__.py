"""The scheduler runtime: pure policy over the store and the plugin contract.

No process, container, HTTP or config-file code lives here; tests drive it with an in-process
executor and a controllable clock.
"""

from conduit_core.runtime._admission import HUMAN_GATE, NeedsYou, StartGateError, needs_you
from conduit_core.runtime._binding_keys import binding_key, debounce_key, dedup_scope
from conduit_core.runtime._budgets import BudgetBook, BudgetNotice
from conduit_core.runtime._clock import Clock, ManualClock, SystemClock
from conduit_core.runtime._holder import HeldLease, hold_lease
from conduit_core.runtime._options import JOBS_POOL, SchedulerOptions
from conduit_core.runtime._scheduler import Attempt, Scheduler
from conduit_core.runtime._taskpool import TaskPool

__all__ = [
    "HUMAN_GATE",
    "JOBS_POOL",
    "Attempt",
    "BudgetBook",
    "BudgetNotice",
    "Clock",
    "HeldLease",
    "ManualClock",
    "NeedsYou",
    "Scheduler",
    "SchedulerOptions",
    "StartGateError",
    "SystemClock",
    "TaskPool",
    "binding_key",
    "debounce_key",
    "dedup_scope",
    "hold_lease",
    "needs_you",
]
