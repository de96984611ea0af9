"""The python executor: each attempt is a shell job running the runner in its own interpreter.

Everything durable is the shell executor's (generation 3), reached through its public class: the
workspace per execution and epoch, the launch intent recorded before anything starts, the wrapper
that records the exit status, discovery by marker, the verified stop (the stop signal, then KILL
of the process group) and the deadline check. This class only translates the python binding config
into that shell job's config; the recovery metadata is the shell generation's own.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

import msgspec

from conduit_core.extension import (
    ExecutionContext,
    Executor,
    Handle,
    OperationError,
    PhaseOutcome,
    StopEvidence,
    StopTarget,
)
from conduit_executors_python._config import PythonConfig, decode_config, shell_config
from conduit_executors_python._workers import WarmWorkers
from conduit_executors_shell import ShellExecutor

__all__ = ["CURRENT_GENERATION", "EXECUTOR_NAME", "SHELL_GENERATION", "PythonExecutor"]

EXECUTOR_NAME = "python"
CURRENT_GENERATION = 1
#: The shell generation each python generation runs its jobs as: pinned, so a later shell
#: generation never changes how an attempt pinned to this one is recovered.
SHELL_GENERATION = {1: 3}


class PythonExecutor(Executor):
    """Runs a binding's Python callable as a detached process group that outlives the daemon."""

    def __init__(self, generation: int = CURRENT_GENERATION) -> None:
        self.generation = generation
        self._shell = ShellExecutor(SHELL_GENERATION[generation])
        self._warm = WarmWorkers()

    def __repr__(self) -> str:
        return f"PythonExecutor(generation={self.generation})"

    async def run(self, ctx: ExecutionContext) -> Handle:
        config = decode_config(ctx.config)
        if config.mode == "warm" and self._warm.running(config, ctx.env):
            return await self._warm.run(ctx, config)  # its interpreter was found when it started
        interpreter = config.interpreter()
        if shutil.which(interpreter) is None:
            # Before the intent: nothing is recorded or started for a binding that cannot run.
            raise OperationError(
                "invalid_config",
                f"python binding config: no executable interpreter {interpreter!r} - at `$.python`",
                permanent=True,
            )
        if config.mode == "warm":
            return await self._warm.run(ctx, config)
        return await self._shell.run(_as_shell_job(ctx))

    async def recover(self, ctx: ExecutionContext) -> Handle:
        if decode_config(ctx.config).mode == "warm":
            return await self._warm.recover(ctx)
        return await self._shell.recover(_as_shell_job(ctx))

    async def stop(self, target: StopTarget) -> StopEvidence:
        decoded: PythonConfig | None
        try:
            decoded = decode_config(target.config)
        except OperationError:
            decoded = None  # A stop must still work for a binding that has since become invalid.
        if decoded is not None and decoded.mode == "warm":
            return await self._warm.stop(target, self.generation)
        config = {} if decoded is None else shell_config(decoded)
        return await self._shell.stop(msgspec.structs.replace(target, config=config))

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        return await self.stop(target)

    async def output_tail(self, target: StopTarget, stream: str, max_bytes: int) -> bytes | None:
        # The job's workspace is the shell generation's: its record names it.
        return await self._shell.output_tail(target, stream, max_bytes)


def _as_shell_job(ctx: ExecutionContext) -> ExecutionContext:
    """The same attempt, with the shell job config; its fenced writes go through ``ctx``."""
    return ExecutionContext(
        execution_id=ctx.execution_id,
        work_id=ctx.work_id,
        attempt=ctx.attempt,
        epoch=ctx.epoch,
        scope=ctx.scope,
        binding=ctx.binding,
        executor=ctx.executor,
        generation=ctx.generation,
        config=shell_config(decode_config(ctx.config)),
        inputs=ctx.inputs,
        env=ctx.env,
        deadline_ms=ctx.deadline_ms,
        recovery=ctx.recovery,
        launch_intent=ctx.launch_intent,
        state_dir=ctx.state_dir,
        callbacks=_Through(ctx),
    )


class _Through:
    """The attempt callbacks of a derived context: every write is the original context's own
    (so its lease fencing, and whatever the caller wrapped around it, apply unchanged)."""

    def __init__(self, ctx: ExecutionContext) -> None:
        self._ctx = ctx

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        await self._ctx.persist_recovery(metadata)

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        await self._ctx.record_launch_intent(intent)

    async def begin_phase(self, name: str) -> None:
        await self._ctx.begin_phase(name)

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        await self._ctx.end_phase(name, outcome)

    async def pin(self, ref: str) -> None:
        await self._ctx.pin(ref)
