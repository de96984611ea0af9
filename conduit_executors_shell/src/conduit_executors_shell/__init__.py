"""conduit executor ``shell``: a command run as a detached process group that outlives the daemon.

The plugin entry point is :mod:`conduit_executors_shell.plugin`; these names are for tests and for
packages that build on the shell executor.
"""

from conduit_executors_shell._config import ShellConfig, decode_config
from conduit_executors_shell._executor import (
    CURRENT_GENERATION,
    EXECUTOR_NAME,
    ShellExecutor,
    ShellHandle,
)
from conduit_executors_shell._metadata import JobRecord, metadata_format
from conduit_executors_shell._results import MAX_RESULT_FILE_BYTES, USAGE_UNIT

__all__ = [
    "CURRENT_GENERATION",
    "EXECUTOR_NAME",
    "MAX_RESULT_FILE_BYTES",
    "USAGE_UNIT",
    "JobRecord",
    "ShellConfig",
    "ShellExecutor",
    "ShellHandle",
    "decode_config",
    "metadata_format",
]
