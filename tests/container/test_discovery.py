"""Recovery without metadata discovers by the launch intent's labels, against a real engine:
nothing labelled proves nothing started; two running containers cannot be told apart (held)."""

from __future__ import annotations

import time
from pathlib import Path

import docker
import pytest

from conduit_core.extension import LeaseLostError, NotStartedError, OperationError
from conduit_executors_container import EPOCH_LABEL, EXECUTION_LABEL, ContainerExecutor

from .conftest import TEST_IMAGE
from .engine_checks import WAIT_FOR_GO, events, labelled
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


async def test_recover_with_nothing_labelled_proves_nothing_started(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    since = time.time()
    config = {"image": TEST_IMAGE, "command": WAIT_FOR_GO}
    intent = RecordingCallbacks(lose_lease_before="container_create")
    with pytest.raises(LeaseLostError):
        await executor.run(
            make_context(
                execution_id=execution_id, config=config, callbacks=intent, state_dir=state_dir
            )
        )
    assert intent.launch_intent is not None  # recorded before the create that never came
    recovered = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id, config=config, callbacks=recovered, state_dir=state_dir,
        epoch=2,
    )  # fmt: skip
    ctx.launch_intent = intent.launch_intent
    with pytest.raises(NotStartedError):
        await executor.recover(ctx)
    assert recovered.metadata is None
    # Recovery never creates a container.
    assert labelled(docker_api, execution_id) == []
    assert events(docker_api, execution_id, since, "create") == []


async def test_recover_refuses_to_choose_between_two_running_containers(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    for epoch in (1, 2):
        made = docker_api.create_container(
            TEST_IMAGE, ["sleep", "300"],
            labels={EXECUTION_LABEL: execution_id, EPOCH_LABEL: str(epoch)},
        )  # fmt: skip
        docker_api.start(made["Id"])
    ctx = make_context(
        execution_id=execution_id, config={"image": TEST_IMAGE}, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=3,
    )  # fmt: skip
    with pytest.raises(OperationError) as caught:
        await executor.recover(ctx)
    # Neither NotStarted nor ResourcesGone: "cannot tell", so the core holds the attempt.
    assert type(caught.value) is OperationError
    assert caught.value.code == "recovery_unprovable"
