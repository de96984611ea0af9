"""Timeouts, stops, refused pins, relaunch and adoption against a real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from conduit_core.errors import LeaseLostError
from conduit_core.extension import NotStartedError, OperationError, OutcomeKind
from conduit_executors_container import ContainerExecutor, container_name

from .conftest import TEST_IMAGE
from .crash_launcher import CRASH_JOB
from .engine_checks import (
    WAIT_FOR_GO,
    artifact_text,
    events,
    inspect_or_none,
    labelled,
    poll,
    release,
)
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_timeout_stops_and_removes_the_container(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config={
            "image": TEST_IMAGE,
            "command": "echo before-timeout; sleep 60",
            "timeout_seconds": 0.5,
            "stop_grace_seconds": 1,
        },
        callbacks=callbacks,
        state_dir=state_dir,
    )
    result = await (await executor.run(ctx)).wait()
    assert result.outcome is OutcomeKind.FAILED
    assert result.data["code"] == "timeout"
    assert result.summary.startswith("timeout:")
    assert "removed" in result.data["stop"]
    # Verified through the engine: the container no longer exists, under any state.
    assert inspect_or_none(docker_api, callbacks.pins[0]) is None
    assert labelled(docker_api, execution_id) == []
    kept = [p.name for p in state_dir.iterdir()]  # noqa: ASYNC240 - a test's own tmp dir
    assert kept, "the result directory lives in the host's state directory"


async def test_stop_is_verified_and_interrupt_takes_the_same_path(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    for epoch, control in ((1, executor.stop), (2, executor.interrupt)):
        callbacks = RecordingCallbacks()
        ctx = make_context(
            execution_id=execution_id,
            config={"image": TEST_IMAGE, "command": "sleep 60", "stop_grace_seconds": 0},
            callbacks=callbacks,
            state_dir=state_dir,
            epoch=epoch,
        )
        handle = await executor.run(ctx)
        evidence = await control(ctx.stop_target())
        assert evidence.verified, evidence.detail
        assert callbacks.pins[0][:12] in evidence.detail
        assert inspect_or_none(docker_api, callbacks.pins[0]) is None
        with pytest.raises(OperationError) as caught:
            await handle.wait()
        assert caught.value.code == "container_missing"
    # Nothing left to stop is verified too.
    assert (await executor.stop(ctx.stop_target())).verified


async def test_refused_pin_removes_the_container_and_starts_nothing(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    since = time.time()
    callbacks = RecordingCallbacks(lose_lease_before="pin")
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": "echo must-not-run"},
        callbacks=callbacks,
        state_dir=state_dir,
    )
    with pytest.raises(LeaseLostError):
        await executor.run(ctx)
    assert callbacks.pins == []
    assert callbacks.metadata is None
    assert labelled(docker_api, execution_id) == []
    assert len(events(docker_api, execution_id, since, "create")) == 1
    assert events(docker_api, execution_id, since, "start") == []
    assert len(events(docker_api, execution_id, since, "destroy")) == 1


async def test_lease_lost_after_the_pin_is_adopted_not_relaunched(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    since = time.time()
    config = {"image": TEST_IMAGE, "command": "echo adopted; exit 4"}
    lost = RecordingCallbacks(lose_lease_before="persist_recovery")
    with pytest.raises(LeaseLostError):
        await executor.run(
            make_context(
                execution_id=execution_id, config=config, callbacks=lost, state_dir=state_dir
            )
        )
    [pinned] = lost.pins
    state = inspect_or_none(docker_api, pinned)
    assert state is not None
    assert state["State"]["Status"] == "created"  # pinned, kept, never started

    # The recovery has no metadata (its write was refused): it finds the pinned container.
    recovered = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id, config=config, callbacks=recovered, state_dir=state_dir, epoch=2
    )
    result = await (await executor.recover(ctx)).wait()
    assert result.data["exit_status"] == 4
    assert artifact_text(result, "stdout") == "adopted\n"
    assert recovered.metadata is not None
    assert recovered.metadata["container_id"] == pinned
    assert len(events(docker_api, execution_id, since, "create")) == 1
    assert len(events(docker_api, execution_id, since, "start")) == 1


async def test_a_launch_reaching_the_start_past_its_deadline_starts_nothing(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    # The host stalled mid-launch past the attempt's deadline: a container started now would
    # only be stopped, and the retry would run the job again.
    since = time.time()
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id, config={"image": TEST_IMAGE, "command": "true"},
        callbacks=callbacks, state_dir=state_dir, deadline_ms=int(time.time() * 1000) - 1,
    )  # fmt: skip
    with pytest.raises(NotStartedError, match="deadline passed"):
        await executor.run(ctx)
    assert callbacks.metadata is None  # nothing for recovery to contradict
    assert events(docker_api, execution_id, since, "start") == []
    assert labelled(docker_api, execution_id) == []


async def test_recovery_past_the_deadline_never_starts_a_pinned_container(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    since = time.time()
    config = {"image": TEST_IMAGE, "command": "true"}
    lost = RecordingCallbacks(lose_lease_before="persist_recovery")
    with pytest.raises(LeaseLostError):
        await executor.run(
            make_context(
                execution_id=execution_id, config=config, callbacks=lost, state_dir=state_dir
            )
        )
    ctx = make_context(
        execution_id=execution_id, config=config, callbacks=RecordingCallbacks(),
        state_dir=state_dir, epoch=2, deadline_ms=int(time.time() * 1000) - 1,
    )  # fmt: skip
    with pytest.raises(OperationError) as refused:
        await executor.recover(ctx)
    assert refused.value.code == "deadline_passed"
    assert events(docker_api, execution_id, since, "start") == []
    # The core stops it (verified) and times the attempt out: nothing of it is left.
    evidence = await executor.stop(ctx.stop_target())
    assert evidence.verified
    assert labelled(docker_api, execution_id) == []


async def test_relaunch_removes_the_old_epochs_stopped_container(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    # What a launch at epoch 1 left when it lost its lease before its pin could remove it.
    leftover = docker_api.create_container(
        TEST_IMAGE,
        command=["true"],
        name=container_name(execution_id, 1),
        labels={"conduit.execution": execution_id, "conduit.epoch": "1"},
        host_config=docker_api.create_host_config(network_mode="none"),
    )["Id"]
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": "echo relaunched"},
        callbacks=callbacks,
        state_dir=state_dir,
        epoch=2,
    )
    handle = await executor.run(ctx)
    assert inspect_or_none(docker_api, leftover) is None
    result = await handle.wait()
    assert result.outcome is OutcomeKind.COMPLETED
    assert artifact_text(result, "stdout") == "relaunched\n"


async def test_relaunch_refuses_to_start_beside_a_running_old_container(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    running = docker_api.create_container(
        TEST_IMAGE,
        command=["sleep", "60"],
        labels={"conduit.execution": execution_id, "conduit.epoch": "1"},
        host_config=docker_api.create_host_config(network_mode="none"),
    )["Id"]
    docker_api.start(running)
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": "true"},
        callbacks=callbacks,
        state_dir=state_dir,
        epoch=2,
    )
    with pytest.raises(OperationError) as caught:
        await executor.run(ctx)
    assert caught.value.code == "container_conflict"
    assert callbacks.pins == []
    assert [s["Id"] for s in labelled(docker_api, execution_id)] == [running]


async def test_recover_fails_closed_when_the_pinned_container_is_gone(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    callbacks = RecordingCallbacks()
    config = {"image": TEST_IMAGE, "command": WAIT_FOR_GO}
    ctx = make_context(
        execution_id=execution_id, config=config, callbacks=callbacks, state_dir=state_dir
    )
    await executor.run(ctx)
    docker_api.remove_container(callbacks.pins[0], force=True)
    again = make_context(
        execution_id=execution_id,
        config=config,
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
        epoch=2,
        recovery=callbacks.metadata,
    )
    with pytest.raises(OperationError) as caught:
        await executor.recover(again)
    assert caught.value.code == "container_missing"
    assert container_name(execution_id, 1) in caught.value.message


@pytest.mark.parametrize("exits_before_recovery", [False, True], ids=["running", "exited"])
async def test_sigkilled_launcher_is_adopted_with_exactly_one_container(
    execution_id: str,
    state_dir: Path,
    tmp_path: Path,
    docker_api: docker.APIClient,
    executor: ContainerExecutor,
    exits_before_recovery: bool,
) -> None:
    since = time.time()
    metadata = _launch_then_sigkill(execution_id, state_dir, tmp_path / "recovery.json")
    state = inspect_or_none(docker_api, metadata["container_id"])
    assert state is not None
    assert state["State"]["Running"]  # the container outlived its launcher

    config = {"image": TEST_IMAGE, "command": CRASH_JOB}
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config=config,
        callbacks=callbacks,
        state_dir=state_dir,
        epoch=2,
        recovery=metadata,
    )
    if exits_before_recovery:
        release(metadata["result_dir"])
        poll(
            lambda: not inspect_or_none(docker_api, metadata["container_id"])["State"]["Running"],  # type: ignore[index]
            what="the container to exit",
        )
    handle = await executor.recover(ctx)
    if not exits_before_recovery:
        release(metadata["result_dir"])
    result = await handle.wait()

    assert result.outcome is OutcomeKind.FAILED
    assert result.data["exit_status"] == 7
    assert artifact_text(result, "stdout") == "adopted-output\n"
    assert callbacks.metadata == metadata  # the adoption re-recorded the same container
    assert len(events(docker_api, execution_id, since, "create")) == 1
    assert len(events(docker_api, execution_id, since, "start")) == 1


def _launch_then_sigkill(execution_id: str, state_dir: Path, metadata_file: Path) -> dict[str, Any]:
    """Launch through the executor in another process, SIGKILL it; return what it persisted."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.container.crash_launcher",
            execution_id,
            str(state_dir),
            str(metadata_file),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
    )
    try:
        assert launcher.stdout is not None
        # Printed only after run() returned: pinned, recorded and started.
        assert launcher.stdout.readline() == b"launched\n"
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        if launcher.stdout is not None:
            launcher.stdout.close()
    assert launcher.returncode == -signal.SIGKILL
    metadata: dict[str, Any] = json.loads(metadata_file.read_text())
    return metadata
