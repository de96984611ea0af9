"""A container runs to its end: output, exit status, typed result file, labels, phases."""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker
import pytest

from conduit_core.extension import OutcomeKind
from conduit_executors_container import ContainerExecutor, container_name

from .conftest import TEST_IMAGE
from .engine_checks import WAIT_FOR_GO, artifact_text, inspect_or_none, release
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


async def test_runs_to_completion_and_captures_output(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config={
            "image": TEST_IMAGE,
            "command": "echo hello; echo oops >&2; echo $SECRET $FROM_BINDING",
        },
        callbacks=callbacks,
        state_dir=state_dir,
        env={"SECRET": "s3cret"},
    )
    ctx.config = {**ctx.config, "env": {"FROM_BINDING": "bound"}}
    handle = await executor.run(ctx)
    result = await handle.wait()

    assert result.outcome is OutcomeKind.COMPLETED
    assert result.summary == "exit status 0"
    assert result.data["exit_status"] == 0
    assert artifact_text(result, "stdout") == "hello\ns3cret bound\n"
    assert artifact_text(result, "stderr") == "oops\n"
    assert set(result.usage.units) == {"minutes"}
    assert 0 <= result.usage.units["minutes"] < 1
    # The run environment reached the job but not the recovery metadata.
    assert "s3cret" not in json.dumps(callbacks.metadata)
    # The result is observed, so the exited container is removed.
    assert inspect_or_none(docker_api, callbacks.pins[0]) is None


async def test_phases_and_pin_come_before_the_start(
    executor: ContainerExecutor, execution_id: str, state_dir: Path, docker_api: docker.APIClient
) -> None:
    callbacks = RecordingCallbacks()
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": WAIT_FOR_GO},
        callbacks=callbacks,
        state_dir=state_dir,
    )
    handle = await executor.run(ctx)
    container_id = callbacks.pins[0]
    assert callbacks.events == [
        ("begin", "container_plan"),
        ("end", "container_plan", "ok"),
        # The intent (name and labels) is durable before the container exists.
        ("record_launch_intent",),
        ("begin", "container_create"),
        ("end", "container_create", "ok"),
        ("begin", "container_pin"),
        ("pin", container_id),
        ("end", "container_pin", "ok"),
        ("begin", "container_start"),
        ("persist_recovery",),
        ("end", "container_start", "ok"),
    ]
    state = inspect_or_none(docker_api, container_id)
    assert state is not None
    assert state["State"]["Running"]
    assert state["Name"] == f"/{container_name(execution_id, 1)}"
    assert callbacks.launch_intent is not None
    assert callbacks.launch_intent["name"] == container_name(execution_id, 1)
    assert callbacks.launch_intent["labels"]["conduit.execution"] == execution_id
    labels = state["Config"]["Labels"]
    assert {k: v for k, v in labels.items() if k.startswith("conduit.")} == {
        "conduit.execution": execution_id,
        "conduit.epoch": "1",
        "conduit.work": f"work-{execution_id}",
    }
    assert state["HostConfig"]["NetworkMode"] == "none"
    assert callbacks.metadata is not None
    assert callbacks.metadata["container_id"] == container_id
    assert callbacks.metadata["epoch"] == 1
    # Pinned (phase trail above) strictly before the engine started it.
    started = state["State"]["StartedAt"]
    assert started
    assert not started.startswith("0001-")

    release(callbacks.metadata["result_dir"])
    result = await handle.wait()
    assert result.outcome is OutcomeKind.COMPLETED


async def test_non_zero_exit_fails(
    executor: ContainerExecutor, execution_id: str, state_dir: Path
) -> None:
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": ["/bin/sh", "-c", "echo bad >&2; exit 3"]},
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    result = await (await executor.run(ctx)).wait()
    assert result.outcome is OutcomeKind.FAILED
    assert result.summary == "exit status 3"
    assert result.data["exit_status"] == 3
    assert artifact_text(result, "stderr") == "bad\n"


async def test_typed_result_file(
    executor: ContainerExecutor, execution_id: str, state_dir: Path
) -> None:
    written = {
        "outcome": "completed",
        "summary": "made two widgets",
        "usage": {"units": {"widgets": 2}},
        "data": {"answer": 42},
    }
    ctx = make_context(
        execution_id=execution_id,
        config={
            "image": TEST_IMAGE,
            "command": f"printf '%s' '{json.dumps(written)}' > \"$CONDUIT_RESULT\"",
            "user": "65534:65534",  # the result directory is writable by any container user
        },
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    result = await (await executor.run(ctx)).wait()
    assert result.outcome is OutcomeKind.COMPLETED
    assert result.summary == "made two widgets"
    assert result.usage.units["widgets"] == 2
    assert "minutes" in result.usage.units
    assert result.data == {"answer": 42, "exit_status": 0}


async def test_invalid_result_file_fails_with_its_path(
    executor: ContainerExecutor, execution_id: str, state_dir: Path
) -> None:
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": "echo '{\"outcome\": 5}' > $CONDUIT_RESULT"},
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    result = await (await executor.run(ctx)).wait()
    assert result.outcome is OutcomeKind.FAILED
    assert result.data["code"] == "invalid_result"
    assert "$.outcome" in result.summary


async def test_input_batch_and_log_limit(
    executor: ContainerExecutor, execution_id: str, state_dir: Path
) -> None:
    ctx = make_context(
        execution_id=execution_id,
        config={
            "image": TEST_IMAGE,
            "command": "cat $CONDUIT_INPUT; head -c 100000 /dev/zero | tr '\\0' x; echo END",
            "log_limit_bytes": 1000,
        },
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    result = await (await executor.run(ctx)).wait()
    stdout = artifact_text(result, "stdout")
    assert len(stdout) == 1000
    assert stdout.endswith("xxxEND\n")
    assert result.data["logs_cut"] == ["stdout"]


async def test_wall_time_comes_from_the_engine(
    executor: ContainerExecutor, execution_id: str, state_dir: Path
) -> None:
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": "sleep 0.3"},
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    begun = time.monotonic()
    result = await (await executor.run(ctx)).wait()
    elapsed_minutes = (time.monotonic() - begun) / 60
    # The engine times the container from its start, a moment after the process began.
    assert 0.25 / 60 <= result.usage.units["minutes"] <= elapsed_minutes
