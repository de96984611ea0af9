"""Generation 3: a launch found again from its launch intent alone (no recovery metadata).

A daemon-side process runs the executor with a test-only fault point that SIGKILLs it at one
launch point; a fresh executor then recovers from what that process left durably (the intent,
and the metadata if it got that far), against the real job processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import pytest

from conduit_core.extension import (
    ExecutionContext,
    NotStartedError,
    OperationError,
    OutcomeKind,
    ResourcesGoneError,
    StopTarget,
)
from conduit_executors_shell import ShellExecutor
from conduit_executors_shell._workspace import workspace_path
from tests.shell._harness import (
    FileCallbacks,
    artifact_text,
    is_running,
    make_context,
    new_execution_id,
    read_lines,
    tagged_processes,
    wait_until,
)

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]


class KilledAt:
    """A daemon-side process SIGKILLed by the executor's own fault point ``point``."""

    def __init__(self, tmp_path: Path, point: str, command: str | None = None) -> None:
        self.tmp_path = tmp_path
        self.execution_id = new_execution_id()
        self.side_effect = tmp_path / "runs"
        self.release = tmp_path / "release"
        self.callbacks = FileCallbacks(tmp_path / "recovery.json")
        command = command or (
            f"echo run >> {self.side_effect}; "
            f"while [ ! -e {self.release} ]; do sleep 0.02; done; exit 7"
        )
        self.config: dict[str, Any] = {"command": command, "stop_grace_seconds": 1}
        args = {
            "workdir": str(tmp_path),
            "metadata": str(self.callbacks.metadata_path),
            "config": self.config,
            "execution_id": self.execution_id,
            "generation": 3,
        }
        args_path = tmp_path / "daemon-args.json"
        args_path.write_text(json.dumps(args))
        daemon = subprocess.run(
            [sys.executable, "-m", "tests.shell._daemon_side", str(args_path)],
            cwd=REPO_ROOT,
            env={**os.environ, "CONDUIT_TEST_FAULT": f"{point}:kill"},
            capture_output=True,
            timeout=60,
        )
        assert daemon.returncode == -signal.SIGKILL, daemon.stderr.decode()
        assert b"launched" not in daemon.stdout

    def context(self, generation: int = 3) -> Any:
        ctx, _ = make_context(
            self.tmp_path,
            self.config,
            execution_id=self.execution_id,
            generation=generation,
            epoch=2,
            recovery=self.callbacks.recorded(),
            launch_intent=self.callbacks.recorded_intent(),
            callbacks=FileCallbacks(self.tmp_path / "next-recovery.json"),
        )
        return ctx


async def test_killed_after_spawn_the_running_job_is_adopted_not_rerun(tmp_path: Path) -> None:
    crash = KilledAt(tmp_path, "shell.after_spawn")
    assert crash.callbacks.recorded() is None, "the kill came before the recovery record"
    wait_until(lambda: read_lines(crash.side_effect) == ["run"], "the job to start")

    ctx = crash.context()
    handle = await ShellExecutor().recover(ctx)
    assert ctx.recovery is not None  # persisted, under the new epoch
    assert ctx.recovery["layout"] == "shell/3"
    crash.release.touch()
    result = await handle.wait()

    assert result.summary == "exit status 7"
    assert read_lines(crash.side_effect) == ["run"]
    assert tagged_processes(crash.execution_id) == []


async def test_killed_after_spawn_a_finished_job_is_read_not_rerun(tmp_path: Path) -> None:
    crash = KilledAt(tmp_path, "shell.after_spawn")
    crash.release.touch()
    workspace = Path(crash.callbacks.recorded_intent()["workspace"])  # type: ignore[index]
    wait_until(lambda: (workspace / "exit-status.7").exists(), "the job to record its exit")

    result = await (await ShellExecutor().recover(crash.context())).wait()

    assert result.outcome is OutcomeKind.FAILED
    assert result.summary == "exit status 7"
    assert read_lines(crash.side_effect) == ["run"]


@pytest.mark.parametrize("point", ["shell.before_intent", "shell.after_intent"])
async def test_killed_before_the_spawn_nothing_started(tmp_path: Path, point: str) -> None:
    crash = KilledAt(tmp_path, point)
    intent = crash.callbacks.recorded_intent()
    assert (intent is None) == (point == "shell.before_intent")

    with pytest.raises(NotStartedError) as caught:
        await ShellExecutor().recover(crash.context())
    assert caught.value.code == "not_started"
    assert read_lines(crash.side_effect) == []
    assert tagged_processes(crash.execution_id) == []


async def test_a_wrapper_killed_without_a_status_is_gone(tmp_path: Path) -> None:
    crash = KilledAt(tmp_path, "shell.after_spawn")
    wait_until(lambda: read_lines(crash.side_effect) == ["run"], "the job to start")
    workspace = Path(crash.callbacks.recorded_intent()["workspace"])  # type: ignore[index]
    wrapper = int((workspace / "wrapper.pid").read_text())
    os.killpg(wrapper, signal.SIGKILL)
    wait_until(lambda: tagged_processes(crash.execution_id) == [], "the job's processes to die")

    with pytest.raises(ResourcesGoneError) as caught:
        await ShellExecutor().recover(crash.context())
    assert caught.value.code == "resources_gone"
    assert str(wrapper) in caught.value.message


async def test_a_survivor_without_its_wrapper_is_ambiguous_and_stopped_by_marker(
    tmp_path: Path,
) -> None:
    survivor = tmp_path / "survivor.pid"
    # The job leaves a child in its own session and group, so killing the wrapper's group
    # alone leaves a process carrying the marker.
    command = f"setsid sleep 60 & echo $! > {survivor}; echo run >> {tmp_path / 'runs'}; sleep 60"
    crash = KilledAt(tmp_path, "shell.after_spawn", command=command)
    wait_until(lambda: _leads_own_session(survivor), "the survivor to leave the job's session")
    workspace = Path(crash.callbacks.recorded_intent()["workspace"])  # type: ignore[index]
    os.killpg(int((workspace / "wrapper.pid").read_text()), signal.SIGKILL)
    wait_until(lambda: len(tagged_processes(crash.execution_id)) == 1, "only the survivor left")

    ctx = crash.context()
    with pytest.raises(OperationError) as caught:
        await ShellExecutor().recover(ctx)
    assert caught.value.code == "recovery_ambiguous"
    assert not isinstance(caught.value, NotStartedError | ResourcesGoneError)

    evidence = await ShellExecutor().stop(ctx.stop_target())  # no metadata: found by marker
    assert evidence.verified, evidence.detail
    assert tagged_processes(crash.execution_id) == []


def _leads_own_session(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text())
        return os.getsid(pid) == pid and psutil.Process(pid).name() == "sleep"
    except (ValueError, OSError, psutil.Error):
        return False


async def test_generation_3_without_intent_or_metadata_never_started(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": "true"})
    with pytest.raises(NotStartedError):
        await ShellExecutor().recover(ctx)
    # Negative control: generations 1 and 2 record no intent, so they cannot tell.
    ctx, _ = make_context(tmp_path, {"command": "true"}, generation=2)
    with pytest.raises(OperationError) as caught:
        await ShellExecutor(2).recover(ctx)
    assert caught.value.code == "recovery_unprovable"


async def test_generation_3_metadata_of_a_vanished_job_is_gone(tmp_path: Path) -> None:
    ctx, callbacks = make_context(tmp_path, {"command": "sleep 60"})
    handle = await ShellExecutor().run(ctx)
    recorded = callbacks.recorded()
    assert recorded is not None
    os.killpg(recorded["process"]["pgid"], signal.SIGKILL)
    with pytest.raises(OperationError, match="without recording an exit status"):
        await handle.wait()  # reaps the wrapper, as a later daemon would never see it
    wait_until(lambda: tagged_processes(ctx.execution_id) == [], "the job to die")

    later, _ = make_context(
        tmp_path, {"command": "sleep 60"}, execution_id=ctx.execution_id, epoch=2,
        recovery=recorded, callbacks=FileCallbacks(tmp_path / "next.json"),
    )  # fmt: skip
    with pytest.raises(ResourcesGoneError):
        await ShellExecutor().recover(later)


@pytest.mark.parametrize(
    "ids", [("k:0", "k_0"), ("a b", "a_b", "a/b", "a\nb", "a\\b"), ("..", "__", ".")]
)
def test_workspace_paths_are_injective_in_execution_and_epoch(
    tmp_path: Path, ids: tuple[str, ...]
) -> None:
    paths = {workspace_path(str(tmp_path), i, epoch) for i in ids for epoch in (1, 2)}
    assert len(paths) == 2 * len(ids)
    root = tmp_path  # the host gives each executor a state directory of its own
    for path in paths:
        assert path.parent.parent == root, "an id must never name a path outside the root"
        assert path.parent.name.isascii()
        assert "\n" not in path.parent.name


async def test_ids_that_sanitize_alike_keep_their_own_output_and_status(tmp_path: Path) -> None:
    executor = ShellExecutor()
    handles = []
    for n, execution_id in enumerate(["k:0", "k_0", "a b", "a_b"]):
        config = {"command": f'echo "$CONDUIT_EXECUTION_ID"; exit {n + 1}'}
        ctx, _ = make_context(
            tmp_path, config, execution_id=execution_id,
            callbacks=FileCallbacks(tmp_path / f"recovery-{n}.json"),
        )  # fmt: skip
        handles.append((execution_id, n + 1, await executor.run(ctx)))
    for execution_id, status, handle in handles:
        result = await handle.wait()
        assert result.summary == f"exit status {status}"
        assert artifact_text(result, "stdout") == f"{execution_id}\n"


class _Installation(NamedTuple):
    ctx: ExecutionContext
    callbacks: FileCallbacks
    executor: ShellExecutor
    pid: int


async def _two_installations(tmp_path: Path, execution_id: str) -> list[_Installation]:
    """Two stores on one machine, each running a Work of the same id: each marker is its own."""
    launched = []
    for name in ("one", "two"):
        ctx, callbacks = make_context(
            tmp_path, {"command": "sleep 60", "stop_grace_seconds": 1}, execution_id=execution_id,
            state_dir=tmp_path / name, callbacks=FileCallbacks(tmp_path / f"{name}.json"),
        )  # fmt: skip
        executor = ShellExecutor()
        await executor.run(ctx)
        pid = callbacks.recorded()["process"]["pid"]  # type: ignore[index]
        launched.append(_Installation(ctx, callbacks, executor, pid))
    return launched


async def test_a_stop_never_reaches_another_installations_job_of_the_same_id(
    tmp_path: Path,
) -> None:
    first, second = await _two_installations(tmp_path, "w1#1")

    evidence = await first.executor.stop(first.ctx.stop_target())
    assert evidence.verified, evidence.detail
    assert is_running(second.pid), "the other installation's job must survive"
    assert not is_running(first.pid)

    # Negative control: by the execution id alone (no metadata) the other job is reached too.
    blind = StopTarget(execution_id="w1#1", epoch=1, work_id="work-1")
    assert (await first.executor.stop(blind)).verified
    assert not is_running(second.pid)
    assert (await second.executor.stop(second.ctx.stop_target())).verified  # reaps its wrapper
    assert tagged_processes("w1#1") == []


async def test_a_stop_with_only_the_launch_intent_reaches_only_that_launch(
    tmp_path: Path,
) -> None:
    # A crash between the intent and the metadata leaves a stop only the intent to go by.
    execution_id = new_execution_id()
    first, second = await _two_installations(tmp_path, execution_id)

    intent_only = StopTarget(
        execution_id=execution_id, epoch=1, work_id="work-1",
        launch_intent=first.callbacks.recorded_intent(),
    )  # fmt: skip
    evidence = await first.executor.stop(intent_only)
    assert evidence.verified, evidence.detail
    assert not is_running(first.pid), evidence.detail
    assert is_running(second.pid), "a stop by the launch marker must spare the other job"
    assert (await second.executor.stop(second.ctx.stop_target())).verified
    assert tagged_processes(execution_id) == []
