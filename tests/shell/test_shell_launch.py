"""Launching and observing shell jobs: results, usage, phases, limits, timeouts, bad config."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conduit_core.extension import (
    InputEvent,
    LeaseLostError,
    NotStartedError,
    OperationError,
    OutcomeKind,
)
from conduit_executors_shell import ShellExecutor
from tests.shell._harness import (
    artifact_text,
    is_running,
    make_context,
    pid_from_file,
    tagged_processes,
    text,
)

pytestmark = pytest.mark.anyio


async def test_job_runs_with_inputs_env_and_phases_and_completes(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    config = {
        "command": f'cat > {out}.stdin; echo "$CONDUIT_EXECUTION_ID $CONDUIT_WORK_ID '
        f'$CONDUIT_ATTEMPT $FROM_RUN $SHARED" > {out}.env; echo done',
        "env": {"SHARED": "binding"},
    }
    inputs = [InputEvent(id="ev-1", type="job.requested", payload={"n": 1})]
    ctx, callbacks = make_context(
        tmp_path, config, inputs=inputs, env={"FROM_RUN": "run", "SHARED": "run"}
    )
    handle = await ShellExecutor().run(ctx)
    # Metadata is durable before the handle exists.
    recorded = callbacks.recorded()
    assert recorded is not None
    assert recorded["layout"] == "shell/3"
    assert set(recorded["process"]) == {"pid", "pgid", "create_time"}
    assert "FROM_RUN" not in json.dumps(recorded)  # the run environment is never persisted
    # The intent was recorded first and names the same workspace and marker.
    assert callbacks.launch_intent is not None
    assert callbacks.launch_intent["workspace"] == recorded["workspace"]
    assert callbacks.launch_intent["marker"] == recorded["marker"]
    assert recorded["marker"].startswith(f"{ctx.execution_id}/1/")
    assert "FROM_RUN" not in json.dumps(callbacks.launch_intent)

    result = await handle.wait()

    assert result.outcome is OutcomeKind.COMPLETED
    assert result.summary == "exit status 0"
    assert result.usage.units["minutes"] >= 0
    assert callbacks.phases == [
        ("workspace", "begin"),
        ("workspace", "ok"),
        ("process_start", "begin"),
        ("process_start", "ok"),
    ]
    stdin_lines = [json.loads(line) for line in text(f"{out}.stdin").splitlines()]
    assert [event["id"] for event in stdin_lines] == ["ev-1"]
    assert text(f"{out}.env").split() == [ctx.execution_id, "work-1", "1", "run", "binding"]
    assert artifact_text(result, "stdout") == "done\n"


async def test_argv_command_runs_without_a_shell(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": ["/bin/echo", "a b", "$HOME"]})
    result = await (await ShellExecutor().run(ctx)).wait()
    assert artifact_text(result, "stdout") == "a b $HOME\n"


async def test_non_zero_exit_fails_with_the_status_in_the_summary(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": "exit 3"})
    result = await (await ShellExecutor().run(ctx)).wait()
    assert result.outcome is OutcomeKind.FAILED
    assert result.summary == "exit status 3"
    assert not result.permanent


async def test_typed_result_file_carries_turn_and_usage(tmp_path: Path) -> None:
    typed = {
        "outcome": "completed",
        "summary": "reviewed",
        "turn": {"status": "approved", "comment": "lgtm"},
        "usage": {"units": {"widgets": 3}},
    }
    command = f"printf '%s' '{json.dumps(typed)}' > \"$CONDUIT_RESULT\"; exit 4"
    ctx, _ = make_context(tmp_path, {"command": command})
    result = await (await ShellExecutor().run(ctx)).wait()
    # The typed result wins over the exit status.
    assert result.outcome is OutcomeKind.COMPLETED
    assert result.summary == "reviewed"
    assert result.turn is not None
    assert (result.turn.status, result.turn.comment) == ("approved", "lgtm")
    assert result.usage.units["widgets"] == 3
    assert "minutes" in result.usage.units
    assert result.data["exit_status"] == 4


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ('{"outcome":"completed","usage":{"units":{"widgets":"many"}}}', "$.usage.units"),
        ('{"outcome":"finished"}', "$.outcome"),
        ('{"outcome":"completed","turn":{"status":"Not Valid"}}', "turn.status"),
        ('{"outcome":"waiting","wait":{"event_type":"x"}}', "cannot wait"),
        ("not json", "not JSON"),
    ],
)
async def test_invalid_result_file_fails_with_a_validation_message(
    tmp_path: Path, written: str, expected: str
) -> None:
    command = f"printf '%s' '{written}' > \"$CONDUIT_RESULT\""
    ctx, _ = make_context(tmp_path, {"command": command})
    result = await (await ShellExecutor().run(ctx)).wait()
    assert result.outcome is OutcomeKind.FAILED
    assert result.summary.startswith("invalid_result: ")
    assert expected in result.summary


async def test_output_beyond_the_limit_keeps_the_tail(tmp_path: Path) -> None:
    command = "i=0; while [ $i -lt 200 ]; do echo line-$i; i=$((i+1)); done"
    ctx, _ = make_context(tmp_path, {"command": command, "max_stdout_bytes": 9})
    result = await (await ShellExecutor().run(ctx)).wait()
    assert artifact_text(result, "stdout") == "line-199\n"


async def test_timeout_stops_the_whole_group_including_a_grandchild_ignoring_sigterm(
    tmp_path: Path,
) -> None:
    grandchild = tmp_path / "grandchild.pid"
    command = (
        f'sh -c \'trap "" TERM; echo $$ > {grandchild}.tmp; mv {grandchild}.tmp {grandchild}; '
        "exec sleep 60' & wait"
    )
    config = {"command": command, "timeout_seconds": 1, "stop_grace_seconds": 0.2}
    ctx, _ = make_context(tmp_path, config)
    started = time.monotonic()
    result = await (await ShellExecutor().run(ctx)).wait()

    assert result.outcome is OutcomeKind.FAILED
    assert result.data["code"] == "timeout"
    assert result.summary.startswith("timeout")
    assert "needed SIGKILL" in result.data["stop"]
    assert time.monotonic() - started < 10
    assert not is_running(pid_from_file(grandchild))
    assert tagged_processes(ctx.execution_id) == []


async def test_attempt_deadline_applies_without_a_binding_timeout(tmp_path: Path) -> None:
    deadline_ms = int((time.time() + 0.5) * 1000)
    ctx, _ = make_context(tmp_path, {"command": "sleep 60"}, deadline_ms=deadline_ms)
    result = await (await ShellExecutor().run(ctx)).wait()
    assert result.data["code"] == "timeout"
    assert tagged_processes(ctx.execution_id) == []


async def test_a_launch_reaching_the_spawn_past_its_deadline_starts_nothing(
    tmp_path: Path,
) -> None:
    # A host that stalled mid-launch past the deadline: starting now would only stop the job and
    # its retry would run it again. Nothing starts; the recorded intent proves it to recovery.
    side = tmp_path / "ran"
    deadline_ms = int(time.time() * 1000) - 1
    ctx, callbacks = make_context(tmp_path, {"command": f"touch {side}"}, deadline_ms=deadline_ms)
    with pytest.raises(NotStartedError, match="deadline passed"):
        await ShellExecutor().run(ctx)
    assert callbacks.recorded() is None
    assert tagged_processes(ctx.execution_id) == []
    assert not side.exists()
    # A recovery (by the intent recorded before it) proves the same: nothing started.
    again, _ = make_context(
        tmp_path, {"command": f"touch {side}"}, execution_id=ctx.execution_id, epoch=2,
        launch_intent=callbacks.recorded_intent(), deadline_ms=deadline_ms,
    )  # fmt: skip
    with pytest.raises(NotStartedError):
        await ShellExecutor().recover(again)


async def test_a_wrapper_forked_past_its_deadline_starts_nothing(tmp_path: Path) -> None:
    # The host passed its own check, then stalled (SIGSTOP) before the fork: the wrapper, which
    # the stall cannot reach, checks the deadline itself. Simulated by a deadline long past on
    # the uptime clock the wrapper reads.
    side = tmp_path / "ran"
    ctx, callbacks = make_context(
        tmp_path, {"command": f"touch {side}"}, env={"CONDUIT_DEADLINE_UPTIME_CS": "1"}
    )
    result = await (await ShellExecutor().run(ctx)).wait()
    assert result.outcome is OutcomeKind.FAILED
    assert result.data == {"code": "timeout", "started": False}
    assert "nothing ran" in result.summary
    assert not side.exists()
    # A recovery by the intent alone reads the same: finished, nothing ran, nothing to stop.
    again, _ = make_context(
        tmp_path, {"command": f"touch {side}"}, execution_id=ctx.execution_id, epoch=2,
        launch_intent=callbacks.recorded_intent(),
    )  # fmt: skip
    recovered = await (await ShellExecutor().recover(again)).wait()
    assert recovered.data == {"code": "timeout", "started": False}
    assert not side.exists()


async def test_a_wrapper_within_its_deadline_runs_the_job(tmp_path: Path) -> None:
    # Negative control for the wrapper's own check, on the real clock: an hour left runs it.
    side = tmp_path / "ran"
    deadline_ms = int((time.time() + 3600) * 1000)
    ctx, _ = make_context(tmp_path, {"command": f"touch {side}"}, deadline_ms=deadline_ms)
    result = await (await ShellExecutor().run(ctx)).wait()
    assert result.outcome is OutcomeKind.COMPLETED
    assert side.exists()


async def test_background_leftovers_end_with_the_job(tmp_path: Path) -> None:
    leftover = tmp_path / "leftover.pid"
    command = f"sleep 60 & echo $! > {leftover}; exit 0"
    ctx, _ = make_context(tmp_path, {"command": command, "stop_grace_seconds": 1})
    result = await (await ShellExecutor().run(ctx)).wait()
    assert result.outcome is OutcomeKind.COMPLETED
    assert not is_running(pid_from_file(leftover))


async def test_refused_metadata_write_stops_the_launched_job(tmp_path: Path) -> None:
    ctx, callbacks = make_context(tmp_path, {"command": "sleep 60"})
    callbacks.refuse_metadata = True
    with pytest.raises(LeaseLostError):
        await ShellExecutor().run(ctx)
    assert tagged_processes(ctx.execution_id) == []
    assert callbacks.phases[-1] == ("process_start", "failed")


async def test_refused_launch_intent_starts_nothing(tmp_path: Path) -> None:
    side = tmp_path / "ran"
    ctx, callbacks = make_context(tmp_path, {"command": f"touch {side}; sleep 60"})
    callbacks.refuse_writes = True
    with pytest.raises(LeaseLostError):
        await ShellExecutor().run(ctx)
    # Nothing was created or started: no workspace, no phase, no process, no side effect.
    assert callbacks.phases == []
    assert not (tmp_path / "state").exists()
    assert tagged_processes(ctx.execution_id) == []
    assert not side.exists()


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"command": "true", "bogus": 1}, "$.bogus"),
        ({"command": []}, "$.command"),
        ({}, "command"),
        ({"command": "true", "stop_signal": "SIGNOPE"}, "$.stop_signal"),
        ({"command": "true", "timeout_seconds": -1}, "$.timeout_seconds"),
        ({"command": "true", "env": {"A": 1}}, "$.env"),
    ],
)
async def test_invalid_config_is_a_permanent_failure(
    tmp_path: Path, config: dict[str, object], path: str
) -> None:
    ctx, callbacks = make_context(tmp_path, config)
    with pytest.raises(OperationError) as caught:
        await ShellExecutor().run(ctx)
    assert caught.value.code == "invalid_config"
    assert caught.value.permanent
    assert path in caught.value.message
    assert callbacks.phases == []


async def test_missing_cwd_is_a_permanent_failure(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": "true", "cwd": str(tmp_path / "nowhere")})
    with pytest.raises(OperationError) as caught:
        await ShellExecutor().run(ctx)
    assert (caught.value.code, caught.value.permanent) == ("invalid_config", True)


async def test_unusable_workspace_is_a_permanent_failure(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    ctx, callbacks = make_context(tmp_path, {"command": "true"}, state_dir=not_a_dir)
    with pytest.raises(OperationError) as caught:
        await ShellExecutor().run(ctx)
    assert (caught.value.code, caught.value.permanent) == ("invalid_config", True)
    assert callbacks.phases == [("workspace", "begin"), ("workspace", "failed")]
