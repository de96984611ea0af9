"""conduit-example-executor: a minimal crash-safe executor (entry point ``example``).

A launch records its intent (its directory and a per-launch marker that every process of the job
carries in its environment) before it starts anything, then starts a detached wrapper that
writes the job's exit status into that directory. Recovery finds the job by the marker alone: a
marked process is a running job, a status file a finished one, neither a job that never started.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec

import conduit_core.extension as ext

MARKER = "CONDUIT_EXAMPLE_LAUNCH"
# Detached jobs that carry MARKER in their environment and leave their exit status in their
# directory: the job is never this process's child and outlives it (see ext.DetachedJobs).
JOBS = ext.DetachedJobs(MARKER)


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    command: str


def decode_config(raw: Mapping[str, Any]) -> Config:
    """The binding config, or permanent ``invalid_config`` naming the bad field's ``$.path``."""
    try:
        return msgspec.convert(dict(raw), Config)
    except msgspec.ValidationError as exc:
        raise ext.OperationError("invalid_config", f"example: {exc}", permanent=True) from exc


def marked_processes(prefix: str) -> list[int]:
    """Live (not zombie) processes whose launch marker starts with ``prefix``."""
    return JOBS.processes(prefix)


def execution_key(execution_id: str) -> str:
    return hashlib.sha256(execution_id.encode()).hexdigest()[:24]


class ExampleHandle(ext.Handle):
    def __init__(self, launch: dict[str, Any]) -> None:
        self.dir, self.marker = Path(launch["dir"]), launch["marker"]

    async def wait(self) -> ext.Result:
        status = await JOBS.wait(self.dir, self.marker)
        if status is None:
            raise ext.OperationError("job_vanished", "the job ended without an exit status")
        outcome = ext.OutcomeKind.COMPLETED if status == 0 else ext.OutcomeKind.FAILED
        return ext.Result(outcome=outcome, summary=f"exit status {status}")


class ExampleExecutor(ext.Executor):
    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        config = decode_config(ctx.config)
        marker = f"{execution_key(ctx.execution_id)}/{ctx.epoch}"
        launch = Path(ctx.state_dir or tempfile.gettempdir(), "example", marker)
        intent = {"dir": str(launch), "marker": marker}
        await ctx.record_launch_intent(intent)  # durable before anything starts
        env = {**ctx.env, "CONDUIT_EXECUTION_ID": ctx.execution_id}
        await JOBS.start(launch, config.command, marker, env)
        await ctx.persist_recovery(intent)
        return ExampleHandle(intent)

    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        launch = ctx.recovery or ctx.launch_intent
        if launch is None:
            raise ext.NotStartedError("no launch intent was recorded, so nothing was started")
        # Processes first: a job that exits in between has written its status by then.
        running = await anyio.to_thread.run_sync(marked_processes, launch["marker"])
        if not running and not await anyio.Path(launch["dir"], "status").exists():
            if ctx.recovery is None:
                raise ext.NotStartedError(f"no process carries launch marker {launch['marker']}")
            raise ext.ResourcesGoneError(f"launch {launch['marker']} left no process and no status")
        await ctx.persist_recovery(launch)
        return ExampleHandle(launch)

    async def stop(self, target: ext.StopTarget) -> ext.StopEvidence:
        # No grace: the example keeps it short.
        return await JOBS.kill(f"{execution_key(target.execution_id)}/")


@ext.hookimpl
def conduit_executors() -> list[ext.ExecutorRegistration]:
    # check_config lets `conduit config check` refuse a bad binding before any attempt runs.
    return [
        ext.ExecutorRegistration(
            name="example", generation=1, executor=ExampleExecutor(), check_config=decode_config
        )
    ]
