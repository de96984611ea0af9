"""Crash drills: a daemon process killed with SIGKILL while its job runs, then recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from conduit_core.extension import OperationError, OutcomeKind
from conduit_executors_shell import ShellExecutor
from tests.shell._harness import (
    is_running,
    make_context,
    new_execution_id,
    read_lines,
    tagged_processes,
    wait_until,
)

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]


class CrashedDaemon:
    """A daemon-side process that launched one job and was then killed with SIGKILL."""

    def __init__(self, tmp_path: Path, generation: int) -> None:
        self.tmp_path = tmp_path
        self.execution_id = new_execution_id()
        self.side_effect = tmp_path / "runs"
        self.release = tmp_path / "release"
        self.metadata_path = tmp_path / "recovery.json"
        # The job records each start, then waits to be released and exits 7.
        command = (
            f"echo run >> {self.side_effect}; "
            f"while [ ! -e {self.release} ]; do sleep 0.02; done; exit 7"
        )
        self.config = {"command": command}
        args = {
            "workdir": str(tmp_path),
            "metadata": str(self.metadata_path),
            "config": self.config,
            "execution_id": self.execution_id,
            "generation": generation,
        }
        args_path = tmp_path / "daemon-args.json"
        args_path.write_text(json.dumps(args))
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "tests.shell._daemon_side", str(args_path)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
        )
        assert self.daemon.stdout is not None
        assert self.daemon.stdout.readline() == b"launched\n"
        wait_until(lambda: read_lines(self.side_effect) == ["run"], "the job to start")
        self.daemon.send_signal(signal.SIGKILL)
        self.daemon.wait()
        self.daemon.stdout.close()

    @property
    def metadata(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.metadata_path.read_text())
        return data

    def recovery_context(self, generation: int) -> Any:
        ctx, _ = make_context(
            self.tmp_path / "next-daemon",
            self.config,
            execution_id=self.execution_id,
            generation=generation,
            epoch=2,
            recovery=self.metadata,
        )
        return ctx


@pytest.fixture
def next_daemon_dir(tmp_path: Path) -> Path:
    (tmp_path / "next-daemon").mkdir()
    return tmp_path


async def test_new_daemon_adopts_the_running_job_and_observes_its_real_exit(
    next_daemon_dir: Path,
) -> None:
    crash = CrashedDaemon(next_daemon_dir, generation=2)
    pid = crash.metadata["process"]["pid"]
    assert is_running(pid), "killing the daemon must not kill the job"

    handle = await ShellExecutor(2).recover(crash.recovery_context(2))
    crash.release.touch()
    result = await handle.wait()

    assert result.outcome is OutcomeKind.FAILED
    assert result.summary == "exit status 7"
    assert read_lines(crash.side_effect) == ["run"], "adoption must not start the job again"
    assert tagged_processes(crash.execution_id) == []


async def test_job_that_ended_while_no_daemon_ran_is_observed_as_finished(
    next_daemon_dir: Path,
) -> None:
    crash = CrashedDaemon(next_daemon_dir, generation=2)
    workspace = Path(crash.metadata["workspace"])
    crash.release.touch()
    wait_until(lambda: (workspace / "exit-status.7").exists(), "the job to record its exit")

    result = await (await ShellExecutor(2).recover(crash.recovery_context(2))).wait()

    assert result.summary == "exit status 7"
    assert read_lines(crash.side_effect) == ["run"]


async def test_attempt_launched_by_generation_1_is_recovered_by_generation_1(
    next_daemon_dir: Path,
) -> None:
    crash = CrashedDaemon(next_daemon_dir, generation=1)
    assert set(crash.metadata) == {"pid", "pgid", "started", "workdir", "launched"}

    # The current generation does not misread the old layout: it fails closed.
    with pytest.raises(OperationError) as caught:
        await ShellExecutor(2).recover(crash.recovery_context(2))
    assert caught.value.code == "recovery_unprovable"
    assert is_running(crash.metadata["pid"])

    handle = await ShellExecutor(1).recover(crash.recovery_context(1))
    crash.release.touch()
    result = await handle.wait()
    assert result.summary == "exit status 7"
    assert read_lines(crash.side_effect) == ["run"]


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is no job's, leading its own session as a job's wrapper would."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


async def test_reused_pid_is_neither_adopted_nor_signalled(
    tmp_path: Path, unrelated: subprocess.Popen[bytes]
) -> None:
    real = psutil.Process(unrelated.pid).create_time()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    fake = {
        "layout": "shell/2",
        "process": {"pid": unrelated.pid, "pgid": unrelated.pid, "create_time": real - 1000},
        "workspace": str(workspace),
        "launched_at": real - 1000,
    }
    ctx, _ = make_context(tmp_path, {"command": "true"}, recovery=fake, epoch=2, generation=2)
    executor = ShellExecutor(2)

    with pytest.raises(OperationError) as caught:
        await executor.recover(ctx)
    assert caught.value.code == "recovery_unprovable"

    evidence = await executor.stop(ctx.stop_target())
    assert evidence.verified
    assert is_running(unrelated.pid), "a stop must not signal a process that is not the job's"

    # Negative control: with its true create time the same process would be adopted.
    genuine = {**fake, "process": {**fake["process"], "create_time": real}}
    ctx, _ = make_context(tmp_path, {"command": "true"}, recovery=genuine, epoch=2)
    await executor.recover(ctx)


async def test_generation_2_recovery_without_metadata_or_workspace_fails_closed(
    tmp_path: Path,
) -> None:
    ctx, _ = make_context(tmp_path, {"command": "true"}, generation=2)
    with pytest.raises(OperationError) as caught:
        await ShellExecutor(2).recover(ctx)
    assert caught.value.code == "recovery_unprovable"

    gone = {
        "layout": "shell/2",
        "process": {"pid": os.getpid(), "pgid": os.getpgid(0), "create_time": 1.0},
        "workspace": str(tmp_path / "gone"),
        "launched_at": 1.0,
    }
    ctx, _ = make_context(tmp_path, {"command": "true"}, recovery=gone, generation=2)
    with pytest.raises(OperationError) as caught:
        await ShellExecutor(2).recover(ctx)
    assert caught.value.code == "recovery_unprovable"
