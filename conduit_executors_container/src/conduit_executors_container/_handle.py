"""Observing one container (launched or adopted) until it exits, and enforcing its deadline."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import anyio
import docker

from conduit_core.extension import Handle, OperationError, Result
from conduit_executors_container import _containers as containers
from conduit_executors_container._config import ContainerConfig
from conduit_executors_container._engine import Engine
from conduit_executors_container._metadata import ContainerRecord
from conduit_executors_container._recovery import engine_time
from conduit_executors_container._results import container_result, timeout_result

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
    ) -> None:
        self._engine = engine
        self._config = config
        self._record = record
        self._deadline = deadline

    @property
    def container_id(self) -> str:
        return self._record.container_id

    async def wait(self) -> Result:
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
                raise OperationError(
                    "container_missing",
                    f"container {self._record.name!r} was removed before its exit was observed",
                )
            if not state["State"].get("Running"):
                break
        result = await self._engine.call(self._finished_result, state)
        # The result is observed and kept on this host: the exited container has served its
        # purpose. A failed removal only leaves it for a relaunch, a stop or reconcile to find.
        with contextlib.suppress(OperationError):
            await self._engine.call(containers.discard, cid)
        return result

    def _finished_result(self, client: docker.APIClient, state: dict[str, Any]) -> Result:
        result_dir = Path(self._record.result_dir)
        cut = containers.capture_logs(
            client, self._record.container_id, result_dir, self._config.log_limit_bytes
        )
        exit_status = int(state["State"].get("ExitCode", -1))
        return container_result(
            result_dir, exit_status, wall_minutes=self._wall_minutes(state), cut=cut
        )

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
            gone = await self._engine.call(containers.remove_verified, cid)
        if not gone:
            # A result would claim the job's resources are free; they are not proven to be.
            raise OperationError(
                "stop_unverified", f"timeout, then container {cid[:12]} was not removed"
            )
        allowed = (self._deadline or time.time()) - self._record.launched_at
        detail = f"container {cid[:12]} stopped and removed; the engine no longer knows it"
        wall = self._wall_minutes(state) if state is not None else 0.0
        return timeout_result(allowed, detail, wall_minutes=wall)

    def _wall_minutes(self, state: dict[str, Any]) -> float:
        # The container's whole run as the engine timed it, so a container adopted after a
        # restart is charged once, including the time no daemon watched it.
        started = engine_time(state["State"].get("StartedAt")) or self._record.launched_at
        finished = engine_time(state["State"].get("FinishedAt")) or time.time()
        return max(0.0, finished - started) / 60.0
