"""conduit's executor conformance suite, run against this package's installed executor."""

from __future__ import annotations

import importlib.util

import pytest

from conduit_core.testing.executor import *  # noqa: F403
from conduit_core.testing.executor import ExecutorSubject
from tests._ci import unavailable

if importlib.util.find_spec("conduit_example_executor") is None:
    # A checkout whose venv predates this package: say how to get it (under CI it must be there).
    unavailable(
        "conduit_example_executor: run scripts/setup.sh to install it", allow_module_level=True
    )
from conduit_example_executor import execution_key, marked_processes


def live(execution_id: str) -> list[str]:
    return [f"pid {pid}" for pid in marked_processes(f"{execution_key(execution_id)}/")]


@pytest.fixture
def executor_subject() -> ExecutorSubject:
    return ExecutorSubject(
        executor="example",
        job_config=lambda script, workdir: {"command": script},
        invalid_config={"command": 42},
        live_resources=live,
    )
