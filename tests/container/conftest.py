"""Fixtures for the container executor tests: a real Docker Engine and the local test image.

Under CI (``tests/_ci.py``) an engine or image that is not there fails the tests; elsewhere they skip.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import docker
import docker.errors
import pytest

from conduit_core.extension import OperationError
from conduit_core.testing.executor import ExecutorSubject
from conduit_executors_container import EXECUTION_LABEL, ContainerExecutor, Engine
from tests._ci import unavailable

TEST_IMAGE = "conduit-test-busybox:latest"


def _unavailable(reason: str) -> NoReturn:
    unavailable(reason)


@pytest.fixture(scope="session")
def docker_api() -> Iterator[docker.APIClient]:
    """A client of the engine the executor uses (DOCKER_HOST or the default socket)."""
    engine = Engine()
    try:
        client = engine.client()
    except OperationError as exc:
        _unavailable(exc.message)
    try:
        client.inspect_image(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        _unavailable(f"the test image {TEST_IMAGE} is not built")
    yield client
    engine.close()


@pytest.fixture
def execution_id(docker_api: docker.APIClient) -> Iterator[str]:
    """A fresh execution id; every container labelled with it is removed after the test."""
    ident = f"t-{uuid.uuid4().hex[:16]}"
    yield ident
    for summary in docker_api.containers(all=True, filters={"label": f"{EXECUTION_LABEL}={ident}"}):
        with contextlib.suppress(docker.errors.NotFound):
            docker_api.remove_container(summary["Id"], force=True)


@pytest.fixture
def executor(docker_api: docker.APIClient) -> Iterator[ContainerExecutor]:
    ex = ContainerExecutor()
    yield ex
    ex.engine.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


def _job_config(script: str, workdir: Path) -> dict[str, Any]:
    # The job's directory appears at the same path inside the container, so the conformance
    # suite's scripts leave their side effects where the suite looks for them.
    return {
        "image": TEST_IMAGE,
        "command": script,
        "mounts": [{"source": str(workdir), "target": str(workdir)}],
        "stop_grace_seconds": 1,
    }


@pytest.fixture
def executor_subject(docker_api: docker.APIClient) -> ExecutorSubject:
    """The container executor as the conformance suite (conduit_core.testing.executor) sees it."""

    def live(execution_id: str) -> list[str]:
        found = docker_api.containers(
            all=True, filters={"label": f"{EXECUTION_LABEL}={execution_id}"}
        )
        return [f"{c['Id'][:12]} ({c['State']})" for c in found]

    return ExecutorSubject(
        executor="container",
        job_config=_job_config,
        invalid_config={"image": ""},
        live_resources=live,
        host_pids=False,
    )
