"""The container executor through a real daemon SIGKILLed mid-container: the restarted daemon
adopts the running container (never creates a second), records its real result, and the
container is removed afterwards. Checked against the Docker Engine's own event stream."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from tests.container.engine_checks import WAIT_FOR_GO, events, labelled
from tests.daemon.conftest import Daemon, wait_for

pytestmark = pytest.mark.docker

TEST_IMAGE = "conduit-test-busybox:latest"
BOXED = f"""
[bindings.boxed]
executor = "container"
config = {{ image = "{TEST_IMAGE}", command = '{WAIT_FOR_GO}; echo adopted-output' }}
"""


def _running_container(api: docker.APIClient, execution_id: str) -> dict[str, object] | None:
    found = [c for c in labelled(api, execution_id) if c["State"] == "running"]
    return found[0] if found else None


def _release(api: docker.APIClient, container_id: str) -> None:
    """Touch /conduit/go through the container's result mount on the host."""
    mounts = api.inspect_container(container_id)["Mounts"]
    source = next(m["Source"] for m in mounts if m["Destination"] == "/conduit")
    Path(source, "go").touch()


def test_daemon_sigkilled_mid_container_adopts_it(
    make_daemon: Callable[..., Daemon], docker_api: docker.APIClient
) -> None:
    since = time.time()
    daemon = make_daemon(lease=2, extra=BOXED).start()
    work_id = daemon.submit("boxed")
    execution_id = daemon.wait_attempt(work_id, "running").attempts[-1].id
    try:
        first = wait_for(
            "the container to run", lambda: _running_container(docker_api, execution_id)
        )

        daemon.signal(signal.SIGKILL)
        daemon.wait_exit()
        assert _running_container(docker_api, execution_id) is not None  # it outlived the daemon

        daemon.start()

        def adopted() -> bool:
            attempt = daemon.show(work_id).attempts[-1]
            return attempt.epoch >= 2 and str(attempt.status) == "running"

        wait_for("the container to be adopted", adopted, timeout=45)
        _release(docker_api, str(first["Id"]))
        detail = daemon.wait_status(work_id, "completed", timeout=60)
        (attempt,) = detail.attempts  # adopted, never a second attempt
        assert attempt.epoch >= 2
        assert any(s.recovered for s in attempt.segments)
        assert not any(s.relaunched for s in attempt.segments)
        assert attempt.result is not None
        assert attempt.result.data["exit_status"] == 0
        # One container, created and started once, and removed once the result was read.
        wait_for("the container to be removed", lambda: labelled(docker_api, execution_id) == [])
        assert len(events(docker_api, execution_id, since, "create")) == 1
        assert len(events(docker_api, execution_id, since, "start")) == 1
        assert len(events(docker_api, execution_id, since, "destroy")) == 1
    finally:
        for summary in labelled(docker_api, execution_id):
            docker_api.remove_container(summary["Id"], force=True)
