"""conduit's executor conformance suite, run against this out-of-process executor program."""

from __future__ import annotations

import importlib.util

import pytest

from conduit_core.testing.executor import *  # noqa: F403
from conduit_core.testing.executor import ExecutorSubject
from tests._ci import unavailable

if importlib.util.find_spec("conduit_example_wire") is None:
    unavailable("conduit_example_wire: run scripts/setup.sh to install it", allow_module_level=True)
from conduit_example_wire import JOBS, key


def live(execution_id: str) -> list[str]:
    return [f"pid {pid}" for pid in JOBS.processes(f"{key(execution_id)}/")]


@pytest.fixture
def executor_subject() -> ExecutorSubject:
    return ExecutorSubject(
        executor="example-wire",
        job_config=lambda script, workdir: {"command": script},
        invalid_config={"command": 42},
        live_resources=live,
    )
