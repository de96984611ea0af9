"""A real daemon SIGKILLed after its container handle recorded the container's end, before the
core settled the attempt: once the container is removed (``container.after_remove``) and while it
still exists (``container.after_record``). The restarted daemon adopts the recorded outcome and
settles the Work completed, with one container ever started (the engine's event stream says so)
and none left. Before the outcome was recorded, the removed case was held as container_missing.

The daemon kills itself through the container handle's test-only fault switch
(``CONDUIT_TEST_FAULT=<point>:kill``), which hits the window exactly every time.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable

import docker
import pytest

from tests.container.engine_checks import events, labelled
from tests.daemon.conftest import Daemon, wait_for

pytestmark = pytest.mark.docker

TEST_IMAGE = "conduit-test-busybox:latest"
BOXED = f"""
[bindings.boxed]
executor = "container"
retry_delays_seconds = []
config = {{ image = "{TEST_IMAGE}", command = 'echo recorded-output; exit 0' }}
"""


# The executor's behaviour does not depend on the store; one is enough for this window.
@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize("point", ["container.after_remove", "container.after_record"])
def test_daemon_killed_after_the_outcome_was_recorded_settles_it_once(
    make_daemon: Callable[..., Daemon], docker_api: docker.APIClient, point: str
) -> None:
    since = time.time()
    daemon = make_daemon(lease=2, extra=BOXED)
    work_id = f"w-{uuid.uuid4().hex[:12]}"
    daemon.cli("work", "submit", "boxed", "--id", work_id)
    daemon.start(wait=False, env={"CONDUIT_TEST_FAULT": f"{point}:kill"})
    assert daemon.wait_exit(timeout=60) == -signal.SIGKILL, daemon.log()
    execution_id = ""
    try:
        daemon.start()
        detail = daemon.wait_status(work_id, "completed", timeout=60)
        (attempt,) = detail.attempts  # adopted, never a second attempt
        execution_id = attempt.id
        assert attempt.epoch >= 2
        assert attempt.segments[-1].recovered
        assert not any(s.relaunched for s in attempt.segments)
        assert attempt.result is not None
        assert attempt.result.data["exit_status"] == 0
        assert detail.work.failure_count == 0
        # One container, created and started once, and gone once the outcome was settled.
        wait_for("the container to be removed", lambda: labelled(docker_api, execution_id) == [])
        assert len(events(docker_api, execution_id, since, "create")) == 1
        assert len(events(docker_api, execution_id, since, "start")) == 1
        assert len(events(docker_api, execution_id, since, "destroy")) == 1
    finally:
        for summary in labelled(docker_api, execution_id) if execution_id else []:
            docker_api.remove_container(summary["Id"], force=True)
