"""The scheduler runtime: pure policy over the store and the plugin contract.

No process, container, HTTP or config-file code lives here; tests drive it with an in-process
executor and a controllable clock.
"""

from conduit_core.runtime._clock import Clock, ManualClock, SystemClock
from conduit_core.runtime._holder import HeldLease, hold_lease
from conduit_core.runtime._options import JOBS_POOL, SchedulerOptions
from conduit_core.runtime._scheduler import Attempt, Scheduler

__all__ = [
    "JOBS_POOL",
    "Attempt",
    "Clock",
    "HeldLease",
    "ManualClock",
    "Scheduler",
    "SchedulerOptions",
    "SystemClock",
    "hold_lease",
]
