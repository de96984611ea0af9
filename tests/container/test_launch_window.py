"""The create→pin window against the real engine: a host SIGKILLed after the container was created
and before its pin was written leaves a created, never-started container; the recovering host
relaunches (nothing ran), removes that leftover, and starts exactly one container."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import pytest

from conduit_core.model import WorkStatus
from conduit_core.testing.executor import CrashPoint, ExecutorSubject, crash_and_recover
from conduit_executors_container import WORK_LABEL

from .engine_checks import events, labelled

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


def _by_work(api: docker.APIClient, work_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api.containers(
        all=True, filters={"label": f"{WORK_LABEL}={work_id}"}
    )
    return found


async def test_host_killed_between_create_and_pin_starts_one_container(
    executor_subject: ExecutorSubject, docker_api: docker.APIClient, tmp_path: Path
) -> None:
    since = time.time()
    left: list[dict[str, Any]] = []

    def look(work_id: str) -> None:
        left.extend(_by_work(docker_api, work_id))

    out = await crash_and_recover(
        executor_subject, CrashPoint.BEFORE_PIN, tmp_path, after_kill=look
    )
    # The dead host left its created container behind, never started.
    assert [c["State"] for c in left] == ["created"]
    [ex] = out.executions
    assert out.work.status is WorkStatus.COMPLETED
    assert out.work.failure_count == 0
    assert out.side_effects == 1
    assert any(s.relaunched for s in ex.segments), "an unpinned launch is relaunched"
    # No second container ran: the engine started exactly one, at the relaunch's epoch.
    starts = events(docker_api, ex.id, since, "start")
    assert len(starts) == 1
    assert starts[0]["id"] != left[0]["Id"]
    # And the leftover is gone, like everything else of the execution.
    assert labelled(docker_api, ex.id) == []
    assert _by_work(docker_api, out.work.id) == []
