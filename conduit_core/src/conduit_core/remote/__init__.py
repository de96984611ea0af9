"""Out-of-process executors: the daemon's side of the wire protocol (docs/wire-protocol.md)."""

from conduit_core.extension.wire import set_program_factory
from conduit_core.remote._program import (
    PROGRAM_ENV,
    CallbackLimits,
    ProgramConnection,
    ProgramGone,
    probe_program,
)
from conduit_core.remote._proxy import (
    ProgramSettings,
    ProgramSupervisor,
    RemoteExecutor,
    check_same_executor,
)
from conduit_core.remote._registry import ProgramSpec, RemoteExecutors, load_remote, resolve_command
from conduit_core.remote._supervised import SupervisedWorker

# An in-process executor's own programs (wire.supervised_program) are this layer's supervisors.
set_program_factory(SupervisedWorker)

__all__ = [
    "PROGRAM_ENV",
    "CallbackLimits",
    "ProgramConnection",
    "ProgramGone",
    "ProgramSettings",
    "ProgramSpec",
    "RemoteExecutors",
    "ProgramSupervisor",
    "RemoteExecutor",
    "SupervisedWorker",
    "check_same_executor",
    "load_remote",
    "probe_program",
    "resolve_command",
]
