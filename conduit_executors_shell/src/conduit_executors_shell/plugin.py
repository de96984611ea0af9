"""The entry point of conduit-executors-shell (group ``conduit``, name ``shell``)."""

from __future__ import annotations

from conduit_core.extension import ExecutorRegistration, hookimpl
from conduit_executors_shell._executor import EXECUTOR_NAME, ShellExecutor

__all__ = ["conduit_executors"]

#: Every generation this package still implements; the manifest declares the same ones.
SUPPORTED_GENERATIONS = (2, 1)


@hookimpl
def conduit_executors() -> list[ExecutorRegistration]:
    """The current generation and generation 1, whose recovery metadata used flat keys."""
    return [
        ExecutorRegistration(
            name=EXECUTOR_NAME, generation=generation, executor=ShellExecutor(generation)
        )
        for generation in SUPPORTED_GENERATIONS
    ]
