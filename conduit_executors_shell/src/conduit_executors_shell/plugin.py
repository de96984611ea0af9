"""The entry point of conduit-executors-shell (group ``conduit``, name ``shell``)."""

from __future__ import annotations

from conduit_core.extension import ExecutorRegistration, hookimpl
from conduit_executors_shell._config import decode_config
from conduit_executors_shell._executor import EXECUTOR_NAME, ShellExecutor

__all__ = ["conduit_executors"]

#: Every generation this package still implements; the manifest declares the same ones.
SUPPORTED_GENERATIONS = (3, 2, 1)


@hookimpl
def conduit_executors() -> list[ExecutorRegistration]:
    """The current generation (3: launch intent and discovery) and the historical 2 and 1."""
    return [
        ExecutorRegistration(
            name=EXECUTOR_NAME,
            generation=generation,
            executor=ShellExecutor(generation),
            check_config=decode_config,
        )
        for generation in SUPPORTED_GENERATIONS
    ]
