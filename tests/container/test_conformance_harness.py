"""The executor conformance suite (``conduit_core.testing.executor``) against the container
executor and a real Docker Engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from conduit_core.testing.executor import *  # noqa: F403
from conduit_core.testing.executor import ExecutorSubject

from .conftest import TEST_IMAGE
from .engine_checks import labelled


def _job_config(script: str, workdir: Path) -> dict[str, Any]:
    # The job's directory appears at the same path inside the container, so the suite's scripts
    # leave their side effects where the suite looks for them.
    return {
        "image": TEST_IMAGE,
        "command": script,
        "mounts": [{"source": str(workdir), "target": str(workdir)}],
        "stop_grace_seconds": 1,
    }


@pytest.fixture
def executor_subject(docker_api: docker.APIClient) -> ExecutorSubject:
    def live(execution_id: str) -> list[str]:
        return [f"{c['Id'][:12]} ({c['State']})" for c in labelled(docker_api, execution_id)]

    return ExecutorSubject(
        executor="container",
        job_config=_job_config,
        invalid_config={"image": ""},
        live_resources=live,
        host_pids=False,
    )
