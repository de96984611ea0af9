"""The daemon's row in the store's daemon registry (``conduit daemons``, ``GET /v1/daemons``).

Written at start, on a pass of the host loop at most every ``DAEMON_HEARTBEAT_MS`` (the
heartbeat rides on a pass the loop runs anyway: no timer of its own) and at exit. A row that
stops being written reads as ``lost`` after ``DAEMON_LOST_AFTER_MS``. The registry is for
people and for the API's "waiting for label" answer; no claim reads it (a claim's labels are
the claiming daemon's own).
"""

from __future__ import annotations

import logging
import os
import socket

import anyio

from conduit_core.daemon._host import HostLoop
from conduit_core.errors import ConduitError
from conduit_core.model import DAEMON_HEARTBEAT_MS, DaemonRecord, DaemonState
from conduit_core.runtime import Scheduler

__all__ = ["DaemonRegistry"]

log = logging.getLogger("conduit.daemon")


class DaemonRegistry:
    """Writes one daemon's registry row; :meth:`heartbeat` is a :data:`PassStep`."""

    def __init__(self, host: HostLoop) -> None:
        self.host = host
        sched = host.scheduler
        self._started_ms = sched.clock.now_ms()
        self._last_write_ms: int | None = None
        self._pid = os.getpid()
        self._hostname = socket.gethostname()
        self._said_draining = False

    def record(self, state: DaemonState | None = None) -> DaemonRecord:
        """The row as of now (``state``: the host loop's, unless given)."""
        host = self.host
        sched = host.scheduler
        if state is None:
            state = DaemonState.DRAINING if host.draining else DaemonState.RUNNING
        return DaemonRecord(
            id=sched.options.owner,
            host=self._hostname,
            pid=self._pid,
            labels=sorted(sched.options.labels),
            state=state,
            load=host.running_count(),
            started_at_ms=self._started_ms,
            last_seen_ms=sched.clock.now_ms(),
        )

    async def write(self, state: DaemonState | None = None) -> None:
        record = self.record(state)
        await self.host.scheduler.store.record_daemon(record)
        self._last_write_ms = record.last_seen_ms

    async def heartbeat(self, sched: Scheduler) -> None:
        """Write the row when the last write is ``DAEMON_HEARTBEAT_MS`` old (or a drain began:
        the registry says ``draining`` at once)."""
        now = sched.clock.now_ms()
        due = self._last_write_ms is None or now - self._last_write_ms >= DAEMON_HEARTBEAT_MS
        if due or (self.host.draining and not self._said_draining):
            await self.write()
            self._said_draining = self.host.draining

    async def stopped(self) -> None:
        """The last write, at exit (shielded, bounded: a store outage cannot hold the exit)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await self.write(DaemonState.STOPPED)
            except ConduitError as exc:
                log.warning("daemon registry: exit not recorded: [%s] %s", exc.code, exc.message)
