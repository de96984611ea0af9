"""The launch lock: a launch's fenced last write and its spawn happen under one file lock.

A host paused between the fenced write that precedes a spawn and the spawn itself would start
the job after a newer epoch had recovered the attempt and found nothing (its discovery or its
stop is only a snapshot). So a launch takes ``<workspace>/launch.lock`` before that write and
keeps it until the job's wrapper exists; discovery and a stop by the launch intent look at the
lock first. Held: a launch is in flight and may still start the job, so they cannot tell (the
attempt is held and asked again). Free: the launch either spawned already (its wrapper or its
status is there to see) or has not written yet, and then its write is refused (the recovery's
claim came first), so it starts nothing.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread

from conduit_core.extension import lock_held

__all__ = ["held_by_a_launch", "launch_lock"]

LOCK_NAME = "launch.lock"


@asynccontextmanager
async def launch_lock(workspace: Path) -> AsyncIterator[None]:
    """Hold the workspace's launch lock for the body (waiting, off the loop, for a look)."""
    fd = os.open(workspace / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        await anyio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def held_by_a_launch(workspace: Path) -> bool:
    """Whether a launch holds the workspace's launch lock now (no workspace: none can)."""
    return lock_held(workspace / LOCK_NAME)
