"""The launch lock (issue 33 A): while a launch holds it — a host paused between its fenced last
write and its spawn — discovery by the intent and a stop by the intent cannot tell, because that
launch may still start the job. Released, the same workspace reads as never started."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from conduit_core.extension import NotStartedError, OperationError, StopTarget
from conduit_executors_shell import ShellExecutor
from conduit_executors_shell._census import ProcessCensus
from conduit_executors_shell._discovery import discover
from conduit_executors_shell._launch_lock import launch_lock
from conduit_executors_shell._metadata import LaunchIntent

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_launch_in_flight_makes_discovery_and_stop_unprovable(tmp_path: Path) -> None:
    workspace = tmp_path / "x-1_1"
    workspace.mkdir()
    intent = LaunchIntent(workspace=str(workspace), marker="x-1/1/0123456789abcdef")
    target = StopTarget(
        execution_id="x-1", epoch=1, work_id="w-1", launch_intent=msgspec.to_builtins(intent)
    )
    executor = ShellExecutor()
    async with launch_lock(workspace):
        with pytest.raises(OperationError) as caught:
            await discover(intent, ProcessCensus())
        assert caught.value.code == "launch_in_progress"
        evidence = await executor.stop(target)
        assert not evidence.verified
        assert "launch.lock" in evidence.detail
    # Negative control: released (the launch spawned nothing), nothing started, nothing to stop.
    with pytest.raises(NotStartedError):
        await discover(intent, ProcessCensus())
    assert (await executor.stop(target)).verified
