"""conduit's executor conformance suite, run against the Node.js executor program.

The program is no Python package: it is declared the way ``[executors.example-node]`` in
conduit.toml declares it (``ExecutorSubject.program``).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from conduit_core.extension import DetachedJobs
from conduit_core.testing.executor import *  # noqa: F403
from conduit_core.testing.executor import ExecutorSubject
from tests._ci import unavailable

PROGRAM = Path(__file__).resolve().parents[1] / "executor.js"
NODE = shutil.which("node")
if NODE is None:
    unavailable("node (Node.js) is not on PATH, for the Node.js example", allow_module_level=True)

# The program marks its jobs like DetachedJobs does, under its own variable.
JOBS = DetachedJobs("CONDUIT_EXAMPLE_NODE_LAUNCH")


def live(execution_id: str) -> list[str]:
    prefix = hashlib.sha256(execution_id.encode()).hexdigest()[:24]
    return [f"pid {pid}" for pid in JOBS.processes(f"{prefix}/")]


@pytest.fixture
def executor_subject() -> ExecutorSubject:
    return ExecutorSubject(
        executor="example-node",
        job_config=lambda script, workdir: {"command": script},
        invalid_config={"command": 42},
        live_resources=live,
        program=[str(NODE), str(PROGRAM)],
    )
