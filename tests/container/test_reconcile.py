"""reconcile lists conduit-labelled containers that no live attempt owns."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from conduit_executors_container import ContainerExecutor, reconcile

from .conftest import TEST_IMAGE
from .engine_checks import WAIT_FOR_GO, release
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


async def test_reconcile_lists_orphans_but_not_live_executions(
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
    orphans = [c for c in reconcile(docker_api) if c.execution_id == execution_id]
    assert [(c.id, c.epoch, c.work_id, c.state) for c in orphans] == [
        (callbacks.pins[0], 1, f"work-{execution_id}", "running")
    ]
    live = await executor.reconcile(frozenset({execution_id}))
    assert all(c.execution_id != execution_id for c in live)
    assert callbacks.metadata is not None
    release(callbacks.metadata["result_dir"])
    await handle.wait()
