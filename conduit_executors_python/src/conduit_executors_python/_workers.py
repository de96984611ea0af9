"""The daemon's side of warm mode: which supervised worker runs (and stops) an attempt.

One worker program per (interpreter, cwd, environment): the binding's ``python``, its ``cwd``
(else the daemon's working directory) and the run environment with the binding's ``env`` over
it. A worker runs any number of attempts at once (``settings.job_concurrency`` bounds them, as
for every ``jobs`` executor), so there is no pool to size: one warm interpreter per distinct
setup is the simplest thing that keeps imports loaded, and the supervisor restarts it when it
dies. Which worker runs which attempt is known only to this daemon (in memory): a worker ends
with the daemon that started it, so an attempt this daemon did not launch cannot be running.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from conduit_core.extension import (
    ExecutionContext,
    Handle,
    LostSightError,
    OperationError,
    ResourcesGoneError,
    Result,
    StopEvidence,
    StopTarget,
    wire,
)
from conduit_executors_python._config import WARM_MODULE, PythonConfig
from conduit_executors_python._proc import end_worker

__all__ = ["WarmWorkers"]

_Key = tuple[str, str | None, tuple[tuple[str, str], ...]]


class WarmWorkers:
    """The warm workers of one executor instance, started on first use."""

    def __init__(self) -> None:
        self._workers: dict[_Key, wire.SupervisedProgram] = {}
        #: The worker each attempt this daemon launched runs in, until it ended (or its worker
        #: died under it).
        self._running: dict[str, _Key] = {}

    def _worker(self, key: _Key) -> wire.SupervisedProgram:
        if key not in self._workers:
            interpreter, cwd, env = key
            self._workers[key] = wire.supervised_program(
                "python", [interpreter, "-m", WARM_MODULE], cwd=cwd, env=dict(env)
            )
        return self._workers[key]

    def running(self, config: PythonConfig, run_env: Mapping[str, str]) -> bool:
        """Whether a worker for this setup was started already."""
        return _key(config, run_env) in self._workers

    async def run(self, ctx: ExecutionContext, config: PythonConfig) -> Handle:
        key = _key(config, ctx.env)
        self._running[ctx.execution_id] = key
        try:
            handle = await self._worker(key).executor(ctx.generation).run(ctx)
        except LostSightError:
            self._running.pop(ctx.execution_id, None)  # its worker died: nothing of it runs
            raise
        return _Tracked(handle, self._running, ctx.execution_id)

    async def recover(self, ctx: ExecutionContext) -> Handle:
        key = self._running.get(ctx.execution_id)
        if key is None:
            # Not launched by this daemon, or its worker died under it. A worker left by a
            # daemon that just died may not have read its end-of-file yet: end it first, so the
            # retry never overlaps the function.
            try:
                found = await _end_worker(ctx.recovery)
            except TimeoutError as exc:
                raise OperationError("stop_unverified", str(exc)) from exc
            raise ResourcesGoneError(
                f"warm mode: {found}, and the function with it; it may have run partly, so the "
                "attempt failed and its retry policy applies"
            )
        handle = await self._worker(key).executor(ctx.generation).recover(ctx)
        return _Tracked(handle, self._running, ctx.execution_id)

    async def stop(self, target: StopTarget, generation: int) -> StopEvidence:
        key = self._running.get(target.execution_id)
        if key is None:
            try:
                found = await _end_worker(target.recovery)
            except TimeoutError as exc:
                return StopEvidence(verified=False, detail=str(exc))
            return StopEvidence(verified=True, detail=f"warm mode: {found}")
        return await self._worker(key).executor(generation).stop(target)

    async def close(self) -> None:
        workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            await worker.close()


async def _end_worker(recovery: Mapping[str, Any] | None) -> str:
    """End the worker the attempt's recovery metadata names, if that process still runs."""
    worker = None if recovery is None else recovery.get("worker")
    return await asyncio.to_thread(end_worker, worker)


def _key(config: PythonConfig, run_env: Mapping[str, str]) -> _Key:
    env = {**run_env, **config.env}
    return (config.interpreter(), config.cwd or os.getcwd(), tuple(sorted(env.items())))


class _Tracked(Handle):
    """Forgets the attempt's worker once its result is in (or its worker died under it); a
    cancelled wait (the daemon stopped observing) keeps it, the function may still run."""

    def __init__(self, handle: Handle, running: dict[str, _Key], execution_id: str) -> None:
        self._handle = handle
        self._running = running
        self._execution_id = execution_id

    async def wait(self) -> Result:
        try:
            result = await self._handle.wait()
        except LostSightError:
            self._running.pop(self._execution_id, None)
            raise
        self._running.pop(self._execution_id, None)
        return result
