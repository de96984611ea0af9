"""The entry point of conduit-executors-python (group ``conduit``, name ``python``)."""

from __future__ import annotations

from conduit_core.extension import ExecutorRegistration, hookimpl
from conduit_executors_python._check import check_binding
from conduit_executors_python._config import decode_config
from conduit_executors_python.executor import EXECUTOR_NAME, SHELL_GENERATION, PythonExecutor

__all__ = ["conduit_executors"]


@hookimpl
def conduit_executors() -> list[ExecutorRegistration]:
    """Generation 1: the runner as a shell generation 3 job (launch intent and discovery)."""
    return [
        ExecutorRegistration(
            name=EXECUTOR_NAME,
            generation=generation,
            executor=PythonExecutor(generation),
            check_config=decode_config,
            check_binding=check_binding,
        )
        for generation in sorted(SHELL_GENERATION, reverse=True)
    ]
