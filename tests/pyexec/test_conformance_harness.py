"""The executor conformance suite (``conduit_core.testing.executor``) run against the python
executor: each job is a function (``tests.pyexec.funcs:run_script``) running the suite's script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conduit_core.testing.executor import *  # noqa: F403
from conduit_core.testing.executor import ExecutorSubject
from tests.pyexec._config import binding
from tests.shell._harness import tagged_processes


def _job_config(script: str, workdir: Path) -> dict[str, Any]:
    # A short grace keeps the TERM-ignoring case quick; the stop must still escalate to KILL.
    return binding(
        "run_script", env={"PYEXEC_SCRIPT": script}, cwd=str(workdir), stop_grace_seconds=0.5
    )


def _live(execution_id: str) -> list[str]:
    return [f"pid {p.pid}" for p in tagged_processes(execution_id)]


@pytest.fixture
def executor_subject() -> ExecutorSubject:
    return ExecutorSubject(
        executor="python",
        job_config=_job_config,
        invalid_config={"function": 42},
        live_resources=_live,
    )
