"""Stable error codes: image_missing and invalid_config are permanent, engine_unreachable is not."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from conduit_core.extension import OperationError
from conduit_executors_container import ContainerExecutor

from .conftest import TEST_IMAGE
from .engine_checks import labelled
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

BOGUS_ENGINE = "unix:///nonexistent/docker.sock"


async def test_missing_image_with_pull_never_is_permanent_and_names_the_image(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config={"image": "conduit-test-absent:never-built", "command": "true"},
        callbacks=callbacks,
        state_dir=state_dir,
    )
    with pytest.raises(OperationError) as caught:
        await executor.run(ctx)
    assert caught.value.code == "image_missing"
    assert caught.value.permanent
    assert "'conduit-test-absent:never-built' is not present" in caught.value.message
    assert callbacks.phases == [("begin", "container_plan"), ("end", "container_plan", "failed")]
    assert labelled(docker_api, execution_id) == []


async def test_pull_if_missing_without_a_registry_fails_retryably(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        # A registry name that cannot resolve: no network is needed to fail.
        config={"image": "registry.invalid/conduit/absent:1", "pull": "if-missing"},
        callbacks=callbacks,
        state_dir=state_dir,
    )
    with pytest.raises(OperationError) as caught:
        await executor.run(ctx)
    assert caught.value.code == "image_pull_failed"
    assert not caught.value.permanent
    assert ("end", "container_create", "failed") in callbacks.phases
    assert labelled(docker_api, execution_id) == []


async def test_invalid_config_is_permanent_with_its_path(
    executor: ContainerExecutor, execution_id: str, state_dir: Path
) -> None:
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "mounts": [{"source": "relative/dir", "target": "/data"}]},
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    with pytest.raises(OperationError) as caught:
        await executor.run(ctx)
    assert caught.value.code == "invalid_config"
    assert caught.value.permanent
    assert "$.mounts[0].source" in caught.value.message


@pytest.mark.parametrize("how", ["base_url", "DOCKER_HOST"])
async def test_unreachable_engine_is_retryable(
    how: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "base_url":
        executor = ContainerExecutor(BOGUS_ENGINE)
    else:
        monkeypatch.setenv("DOCKER_HOST", BOGUS_ENGINE)
        executor = ContainerExecutor()
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id="t-unreachable",
        config={"image": TEST_IMAGE, "command": "true"},
        callbacks=callbacks,
        state_dir=state_dir,
    )
    for attempt in (executor.run, executor.recover):
        with pytest.raises(OperationError) as caught:
            await attempt(ctx)
        assert caught.value.code == "engine_unreachable"
        assert not caught.value.permanent
    evidence = await executor.stop(ctx.stop_target())
    assert not evidence.verified
    assert evidence.detail.startswith("engine_unreachable")
    assert callbacks.pins == []


async def test_engine_refusing_the_config_is_a_permanent_failure(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": ["/no/such/program"]},
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    with pytest.raises(OperationError) as caught:
        await executor.run(ctx)
    assert caught.value.code == "container_refused"
    assert caught.value.permanent
    # Nothing of it runs, so it is not kept for a stop to find.
    assert labelled(docker_api, execution_id) == []
