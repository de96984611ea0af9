"""conduit's executor conformance suite, run against this out-of-process executor program."""

from __future__ import annotations

import os

import pytest

from conduit_core.testing.executor import *  # noqa: F403
from conduit_core.testing.executor import ExecutorSubject

if os.environ.get("CI", "").lower() not in ("true", "1", "yes"):
    pytest.importorskip("conduit_example_wire", reason="run scripts/setup.sh to install it")
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
