"""conduit executor ``container``: a binding's work in a Docker container, bound and pinned
before it starts, adopted after a restart and verifiably removed.

The plugin entry point is :mod:`conduit_executors_container.plugin`; these names are for tests,
for ``conduit doctor`` (:func:`reconcile`) and for packages that build on this executor.
"""

from conduit_executors_container._config import (
    DEFAULT_LOG_LIMIT_BYTES,
    RESULT_MOUNT,
    ContainerConfig,
    MountConfig,
    decode_config,
)
from conduit_executors_container._engine import (
    EPOCH_LABEL,
    EXECUTION_LABEL,
    WORK_LABEL,
    Engine,
    container_name,
)
from conduit_executors_container._executor import (
    CURRENT_GENERATION,
    EXECUTOR_NAME,
    ContainerExecutor,
)
from conduit_executors_container._handle import ContainerHandle
from conduit_executors_container._metadata import ContainerRecord
from conduit_executors_container._reconcile import LabelledContainer, reconcile
from conduit_executors_container._results import MAX_RESULT_FILE_BYTES, USAGE_UNIT

__all__ = [
    "CURRENT_GENERATION",
    "DEFAULT_LOG_LIMIT_BYTES",
    "EPOCH_LABEL",
    "EXECUTION_LABEL",
    "EXECUTOR_NAME",
    "MAX_RESULT_FILE_BYTES",
    "RESULT_MOUNT",
    "USAGE_UNIT",
    "WORK_LABEL",
    "ContainerConfig",
    "ContainerExecutor",
    "ContainerHandle",
    "ContainerRecord",
    "Engine",
    "LabelledContainer",
    "MountConfig",
    "container_name",
    "decode_config",
    "reconcile",
]
