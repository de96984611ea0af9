"""The daemon: the host loop that drives the scheduler, its HTTP listeners and signals."""

from typing import TYPE_CHECKING

from conduit_core._lazy import lazy_exports

if TYPE_CHECKING:
    from conduit_core.daemon._gc import tune_garbage_collection
    from conduit_core.daemon._host import HostLoop, PassStep
    from conduit_core.daemon._key_release import KeyRelease, KeyUnpark
    from conduit_core.daemon._logging import LogFormat, configure_logging
    from conduit_core.daemon._netfs import check_local_filesystem, filesystem_type
    from conduit_core.daemon._paths import DaemonPaths, is_postgres
    from conduit_core.daemon._pidfile import PidFile, PidRecord
    from conduit_core.daemon._registry import DaemonRegistry
    from conduit_core.daemon._routines import RoutinesHost, check_routine_specs
    from conduit_core.daemon._run import Daemon
    from conduit_core.daemon._statistics import StatisticsUpkeep
    from conduit_core.daemon._tracing import check_tracing, start_tracing
    from conduit_core.daemon._wake import WAKE_CHANNEL, PgWakeChannel, Waker, notify_sync
else:  # each part loads on first use: the CLI needs DaemonPaths, not the host loop
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "tune_garbage_collection": "_gc",
            "HostLoop": "_host",
            "PassStep": "_host",
            "KeyRelease": "_key_release",
            "KeyUnpark": "_key_release",
            "LogFormat": "_logging",
            "configure_logging": "_logging",
            "check_local_filesystem": "_netfs",
            "filesystem_type": "_netfs",
            "DaemonPaths": "_paths",
            "is_postgres": "_paths",
            "PidFile": "_pidfile",
            "PidRecord": "_pidfile",
            "DaemonRegistry": "_registry",
            "RoutinesHost": "_routines",
            "check_routine_specs": "_routines",
            "Daemon": "_run",
            "StatisticsUpkeep": "_statistics",
            "check_tracing": "_tracing",
            "start_tracing": "_tracing",
            "PgWakeChannel": "_wake",
            "WAKE_CHANNEL": "_wake",
            "Waker": "_wake",
            "notify_sync": "_wake",
        },
    )

__all__ = [
    "WAKE_CHANNEL",
    "Daemon",
    "DaemonPaths",
    "DaemonRegistry",
    "HostLoop",
    "KeyRelease",
    "KeyUnpark",
    "LogFormat",
    "PassStep",
    "PgWakeChannel",
    "PidFile",
    "PidRecord",
    "RoutinesHost",
    "StatisticsUpkeep",
    "Waker",
    "check_local_filesystem",
    "check_routine_specs",
    "check_tracing",
    "configure_logging",
    "filesystem_type",
    "is_postgres",
    "notify_sync",
    "start_tracing",
    "tune_garbage_collection",
]
