"""Observing one container (launched or adopted) until it exits, and enforcing its deadline.

Its end is recorded on this host (``_outcome``) before the container is removed, so a recovery
after a crash in between reads the same Result without the container.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Any

import anyio
import docker
import docker.errors

from conduit_core.extension import Handle, OperationError, Result, fault_point
from conduit_executors_container import _containers as containers
from conduit_executors_container._config import ContainerConfig
from conduit_executors_container._engine import Engine
from conduit_executors_container._metadata import ContainerRecord
from conduit_executors_container._outcome import RecordedOutcome, read_outcome, write_outcome
from conduit_executors_container._recovery import engine_time

__all__ = ["ContainerHandle"]

# One engine wait lasts at most this long; a fresh one follows. The wait holds a thread, so
# bounding it bounds how long an abandoned (cancelled) wait keeps that thread.
_WAIT_SLICE_SECONDS = 10.0


class ContainerHandle(Handle):
    def __init__(
        self,
        engine: Engine,
        config: ContainerConfig,
        record: ContainerRecord,
        *,
        deadline: float | None,
        recorded: RecordedOutcome | None = None,
    ) -> None:
        self._engine = engine
        self._config = config
        self._record = record
        self._deadline = deadline
        self._recorded = recorded

    @property
    def container_id(self) -> str:
        return self._record.container_id

    async def wait(self) -> Result:
        if self._recorded is not None:
            return await self._settled(self._recorded)
        cid = self._record.container_id
        while True:
            remaining = None if self._deadline is None else self._deadline - time.time()
            if remaining is not None and remaining <= 0:
                return await self._time_out()
            slice_seconds = min(_WAIT_SLICE_SECONDS, remaining or _WAIT_SLICE_SECONDS)
            # Cancelling wait() abandons the engine wait only; the container runs on.
            if not await self._engine.call_abandonable(containers.wait_exit, cid, slice_seconds):
                continue
            state = await self._engine.call(containers.inspect, cid)
            if state is None:
                return await self._settled(await self._recorded_elsewhere())
            if not state["State"].get("Running"):
                break
        try:
            with anyio.CancelScope(shield=True):
                outcome = await self._engine.call(self._record_exit, state)
        except docker.errors.NotFound:
            outcome = await self._recorded_elsewhere()
        return await self._settled(outcome)

    async def _recorded_elsewhere(self) -> RecordedOutcome:
        """The container went away while this handle watched: another observer of it (a
        fenced-out daemon's handle, say) recorded its end before removing it, or nobody did."""
        found = await anyio.to_thread.run_sync(
            functools.partial(
                read_outcome, self._record.result_dir, container_id=self._record.container_id
            )
        )
        if found is None:
            raise OperationError(
                "container_missing",
                f"container {self._record.name!r} was removed before its exit was observed",
            )
        return found

    async def _settled(self, outcome: RecordedOutcome) -> Result:
        """Remove the container whose outcome is recorded, then return that outcome's Result."""
        cid = self._record.container_id
        await fault_point("container.after_record")
        if outcome.kind == "timeout":
            # A timeout's Result says the job's resources are free: the removal is verified.
            with anyio.CancelScope(shield=True):
                gone = await self._engine.call(containers.remove_verified, cid)
            if not gone:
                raise OperationError(
                    "stop_unverified", f"timeout, then container {cid[:12]} was not removed"
                )
        else:
            # The exited container has served its purpose. A failed removal only leaves it for
            # a relaunch, a stop or reconcile to find; its outcome stays recorded either way.
            with contextlib.suppress(OperationError):
                await self._engine.call(containers.discard, cid)
        await fault_point("container.after_remove")
        return outcome.result()

    def _record_exit(self, client: docker.APIClient, state: dict[str, Any]) -> RecordedOutcome:
        """Read the exited container's output and status and record them (before any removal)."""
        cut = containers.capture_logs(
            client,
            self._record.container_id,
            Path(self._record.result_dir),
            self._config.log_limit_bytes,
        )
        outcome = RecordedOutcome(
            record=self._record,
            kind="exited",
            exit_status=int(state["State"].get("ExitCode", -1)),
            wall_minutes=self._wall_minutes(state),
            logs_cut=cut,
        )
        write_outcome(outcome)
        return outcome

    async def _time_out(self) -> Result:
        cid = self._record.container_id
        with anyio.CancelScope(shield=True):
            await self._engine.call(containers.halt, cid, self._config.grace_seconds())
            state = await self._engine.call(containers.inspect, cid)
            if state is not None:
                await self._engine.call(
                    containers.capture_logs,
                    cid,
                    Path(self._record.result_dir),
                    self._config.log_limit_bytes,
                )
            outcome = RecordedOutcome(
                record=self._record,
                kind="timeout",
                wall_minutes=self._wall_minutes(state) if state is not None else 0.0,
                allowed_seconds=(self._deadline or time.time()) - self._record.launched_at,
                stop_detail=f"container {cid[:12]} stopped and removed; the engine no longer "
                "knows it",
            )
            # Recorded before the removal: a recovery after it still finds the timeout.
            await anyio.to_thread.run_sync(write_outcome, outcome)
        return await self._settled(outcome)

    def _wall_minutes(self, state: dict[str, Any]) -> float:
        # The container's whole run as the engine timed it, so a container adopted after a
        # restart is charged once, including the time no daemon watched it.
        started = engine_time(state["State"].get("StartedAt")) or self._record.launched_at
        finished = engine_time(state["State"].get("FinishedAt")) or time.time()
        return max(0.0, finished - started) / 60.0
