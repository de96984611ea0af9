"""A container's end is recorded on the host before the container is removed, so a recovery after
a crash between that removal and the core's settle write returns the same Result, against a real
engine, without a second start (the engine's own events say so)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker
import pytest

from conduit_core.extension import OperationError, OutcomeKind
from conduit_executors_container import (
    EPOCH_LABEL,
    EXECUTION_LABEL,
    RESULT_MOUNT,
    ContainerExecutor,
    ContainerRecord,
)
from conduit_executors_container._outcome import RecordedOutcome, outcome_path, write_outcome

from .conftest import TEST_IMAGE
from .engine_checks import WAIT_FOR_GO, artifact_text, events, inspect_or_none, labelled, release
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TYPED = json.dumps({"outcome": "failed", "summary": "typed", "data": {"answer": 42}})
JOB = f"echo out; echo err >&2; printf '%s' '{TYPED}' > \"$CONDUIT_RESULT\"; exit 3"


async def test_recovery_after_the_result_was_read_and_the_container_removed(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    # The crash this guards against: the handle read the result and removed the container, and
    # the daemon died before the core settled the attempt. Epoch 2 recovers with epoch 1's record.
    since = time.time()
    config = {"image": TEST_IMAGE, "command": JOB}
    first = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id, config=config, callbacks=first, state_dir=state_dir
    )
    observed = await (await executor.run(ctx)).wait()
    assert observed.summary == "typed"
    assert observed.data["answer"] == 42
    assert observed.data["exit_status"] == 3
    assert labelled(docker_api, execution_id) == []  # read, then removed
    assert first.metadata is not None
    # Recorded beside the result directory, never inside the part mounted into the container.
    assert outcome_path(first.metadata["result_dir"]).parent != Path(first.metadata["result_dir"])

    recovered = RecordingCallbacks()
    again = make_context(
        execution_id=execution_id, config=config, callbacks=recovered, state_dir=state_dir,
        epoch=2, recovery=first.metadata,
    )  # fmt: skip
    result = await (await executor.recover(again)).wait()
    assert result == observed
    assert artifact_text(result, "stdout") == "out\n"
    assert artifact_text(result, "stderr") == "err\n"
    assert recovered.metadata == first.metadata  # the adoption is acknowledged under epoch 2
    assert len(events(docker_api, execution_id, since, "create")) == 1
    assert len(events(docker_api, execution_id, since, "start")) == 1


async def test_an_adopted_containers_outcome_is_found_at_a_later_epoch(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    # Epoch 2 adopts epoch 1's container and its handle records the outcome; epoch 3 recovers
    # with epoch 2's metadata, whose result directory is still epoch 1's.
    since = time.time()
    config = {"image": TEST_IMAGE, "command": f"{WAIT_FOR_GO}; echo adopted; exit 5"}
    launched = RecordingCallbacks()
    await executor.run(
        make_context(
            execution_id=execution_id, config=config, callbacks=launched, state_dir=state_dir
        )
    )  # its handle is abandoned: the launching daemon died
    adopting = RecordingCallbacks()
    adoption = make_context(
        execution_id=execution_id, config=config, callbacks=adopting, state_dir=state_dir,
        epoch=2, recovery=launched.metadata,
    )  # fmt: skip
    handle = await executor.recover(adoption)
    assert launched.metadata is not None
    release(launched.metadata["result_dir"])
    observed = await handle.wait()
    assert observed.data["exit_status"] == 5
    assert labelled(docker_api, execution_id) == []

    third = make_context(
        execution_id=execution_id, config=config, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=3, recovery=adopting.metadata,
    )  # fmt: skip
    result = await (await executor.recover(third)).wait()
    assert result == observed
    assert artifact_text(result, "stdout") == "adopted\n"
    assert len(events(docker_api, execution_id, since, "start")) == 1


async def test_a_timeout_is_recorded_before_its_container_is_removed(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    since = time.time()
    config = {
        "image": TEST_IMAGE, "command": "sleep 60", "timeout_seconds": 0.5,
        "stop_grace_seconds": 0,
    }  # fmt: skip
    first = RecordingCallbacks()
    observed = await (
        await executor.run(
            make_context(
                execution_id=execution_id, config=config, callbacks=first, state_dir=state_dir
            )
        )
    ).wait()
    assert observed.data["code"] == "timeout"
    assert labelled(docker_api, execution_id) == []
    again = make_context(
        execution_id=execution_id, config=config, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=2, recovery=first.metadata,
    )  # fmt: skip
    result = await (await executor.recover(again)).wait()
    assert result == observed
    assert len(events(docker_api, execution_id, since, "start")) == 1


async def test_another_containers_record_is_not_taken_for_this_ones(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    config = {"image": TEST_IMAGE, "command": "true"}
    first = RecordingCallbacks()
    await (
        await executor.run(
            make_context(
                execution_id=execution_id, config=config, callbacks=first, state_dir=state_dir
            )
        )
    ).wait()
    assert first.metadata is not None
    # Metadata naming another container in the same result directory: the record there is
    # the first container's, so it proves nothing about this one.
    other = {**first.metadata, "container_id": "f" * 64}
    again = make_context(
        execution_id=execution_id, config=config, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=2, recovery=other,
    )  # fmt: skip
    with pytest.raises(OperationError) as caught:
        await executor.recover(again)
    assert caught.value.code == "container_missing"


async def test_discovery_by_the_launch_intent_finds_a_recorded_outcome(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    # No metadata and no container would say "never started" (a relaunch): a recorded outcome
    # of the intent's container says it ran, and what came of it.
    config = {"image": TEST_IMAGE, "command": "echo once"}
    first = RecordingCallbacks()
    observed = await (
        await executor.run(
            make_context(
                execution_id=execution_id, config=config, callbacks=first, state_dir=state_dir
            )
        )
    ).wait()
    ctx = make_context(
        execution_id=execution_id, config=config, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=2,
    )  # fmt: skip
    ctx.launch_intent = first.launch_intent
    assert await (await executor.recover(ctx)).wait() == observed


async def test_a_relaunch_never_removes_a_container_whose_outcome_is_unrecorded(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    result_dir = state_dir / "epoch-1"
    result_dir.mkdir()
    ran = docker_api.create_container(
        TEST_IMAGE, ["true"], labels={EXECUTION_LABEL: execution_id, EPOCH_LABEL: "1"},
        host_config=docker_api.create_host_config(binds={str(result_dir): RESULT_MOUNT}),
    )["Id"]  # fmt: skip
    docker_api.start(ran)
    docker_api.wait(ran, timeout=30)
    relaunch = make_context(
        execution_id=execution_id, config={"image": TEST_IMAGE, "command": "true"},
        callbacks=RecordingCallbacks(), state_dir=state_dir, epoch=2,
    )  # fmt: skip
    with pytest.raises(OperationError) as caught:
        await executor.run(relaunch)
    assert caught.value.code == "container_conflict"
    assert "outcome is not recorded" in caught.value.message
    assert inspect_or_none(docker_api, ran) is not None  # its outcome is still there to read

    # Once its end is recorded, removing it loses nothing.
    record = ContainerRecord(
        container_id=ran, name="x", epoch=1, result_dir=str(result_dir), launched_at=time.time()
    )
    write_outcome(RecordedOutcome(record=record, kind="exited", exit_status=0, wall_minutes=0.0))
    result = await (await executor.run(relaunch)).wait()
    assert result.outcome is OutcomeKind.COMPLETED
    assert inspect_or_none(docker_api, ran) is None


async def test_a_handle_whose_container_another_observer_removed_returns_its_record(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    # A daemon that lost its lease while paused resumes and its handle (epoch 1) observes the
    # exit, records it and removes the container, while the successor's handle (epoch 2)
    # watches the same container: that one finds the record instead of container_missing.
    config = {"image": TEST_IMAGE, "command": f"{WAIT_FOR_GO}; echo seen-by-both"}
    launched = RecordingCallbacks()
    fenced_out = await executor.run(
        make_context(
            execution_id=execution_id, config=config, callbacks=launched, state_dir=state_dir
        )
    )
    adoption = make_context(
        execution_id=execution_id, config=config, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=2, recovery=launched.metadata,
    )  # fmt: skip
    successor = await executor.recover(adoption)
    assert launched.metadata is not None
    release(launched.metadata["result_dir"])
    observed = await fenced_out.wait()
    assert labelled(docker_api, execution_id) == []
    assert await successor.wait() == observed
