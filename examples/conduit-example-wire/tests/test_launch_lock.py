"""A launch stalled between its intent's fenced write and its spawn (a program the daemon lost
but that still runs) holds the launch lock: a recovery's look then cannot tell — it never answers
"not started" while the late spawn could still come (the window behind a wire duplicate)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conduit_example_wire import JOBS, WireExample, key

import conduit_core.extension as ext
from conduit_core.testing._jobs import RecordingCallbacks

pytestmark = pytest.mark.anyio


def _context(tmp_path: Path, epoch: int, intent: dict[str, str] | None) -> ext.ExecutionContext:
    return ext.ExecutionContext(
        execution_id="w-lock#1", work_id="w-lock", attempt=1, epoch=epoch, scope="root",
        binding="b", executor="example-wire", generation=1, config={"command": "true"},
        launch_intent=intent, state_dir=str(tmp_path), callbacks=RecordingCallbacks(),
    )  # fmt: skip


async def test_a_launch_holding_its_lock_is_not_taken_for_not_started(tmp_path: Path) -> None:
    marker = f"{key('w-lock#1')}/1"
    intent = {"dir": str(tmp_path / "wire" / marker), "marker": marker}
    directory = Path(intent["dir"])
    async with JOBS.launching(directory):  # the stalled launch: intent written, not yet spawned
        assert JOBS.launch_in_progress(directory)
        with pytest.raises(ext.OperationError) as caught:
            await WireExample().recover(_context(tmp_path, 2, intent))
        assert caught.value.code == "launch_in_progress"
    # Control: once no launch holds it, the same look proves nothing started.
    assert not JOBS.launch_in_progress(directory)
    with pytest.raises(ext.NotStartedError):
        await WireExample().recover(_context(tmp_path, 2, intent))
