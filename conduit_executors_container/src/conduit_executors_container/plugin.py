"""The entry point of conduit-executors-container (group ``conduit``, name ``container``)."""

from __future__ import annotations

from conduit_core.extension import ExecutorRegistration, hookimpl
from conduit_executors_container._config import decode_config
from conduit_executors_container._executor import (
    CURRENT_GENERATION,
    EXECUTOR_NAME,
    ContainerExecutor,
)

__all__ = ["conduit_executors"]


@hookimpl
def conduit_executors() -> list[ExecutorRegistration]:
    """Generation 1, the only one so far; the engine comes from ``DOCKER_HOST``."""
    return [
        ExecutorRegistration(
            name=EXECUTOR_NAME,
            generation=CURRENT_GENERATION,
            executor=ContainerExecutor(),
            check_config=decode_config,
        )
    ]
