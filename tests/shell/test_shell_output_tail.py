"""``ShellExecutor.output_tail``: the tail of a job's output file, only inside the executor's
state directory (a recovery record naming another place reads nothing)."""

from __future__ import annotations

from pathlib import Path

import anyio

from conduit_core.extension import StopTarget
from conduit_executors_shell import ShellExecutor


def _target(workspace: Path, state_dir: Path) -> StopTarget:
    record = {
        "layout": "shell/3", "workspace": str(workspace), "launched_at": 1.0, "marker": "m",
        "process": {"pid": 1, "pgid": 1, "create_time": 1.0},
    }  # fmt: skip
    return StopTarget(execution_id="w#1", epoch=1, work_id="w", config={}, recovery=record,
                      state_dir=str(state_dir))  # fmt: skip


def test_the_tail_of_a_workspace_file_and_nothing_outside_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    inside = state / "w-abc" / "epoch-1"
    inside.mkdir(parents=True)
    (inside / "stdout").write_bytes(b"0123456789")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "stdout").write_bytes(b"secret")
    (state / "link").symlink_to(outside)
    shell = ShellExecutor(3)

    async def main() -> None:
        assert await shell.output_tail(_target(inside, state), "stdout", 4) == b"6789"
        assert await shell.output_tail(_target(inside, state), "stdout", 100) == b"0123456789"
        assert await shell.output_tail(_target(inside, state), "stderr", 4) is None  # none yet
        assert await shell.output_tail(_target(inside, state), "result.json", 4) is None
        assert await shell.output_tail(_target(outside, state), "stdout", 100) is None
        assert await shell.output_tail(_target(state / "link", state), "stdout", 100) is None

    anyio.run(main)
