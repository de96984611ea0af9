"""conduit-example-executor: a minimal crash-safe executor (entry point ``example``).

A launch records its intent (its directory and a per-launch marker that every process of the job
carries in its environment) before it starts anything, then starts a detached wrapper that
writes the job's exit status into that directory. Recovery finds the job by the marker alone: a
marked process is a running job, a status file a finished one, neither a job that never started.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec

import conduit_core.extension as ext

MARKER = "CONDUIT_EXAMPLE_LAUNCH"
# The wrapper runs in the background of a shell that exits at once, so the job is never this
# process's child (nothing to reap) and outlives it; the status file appears atomically.
_START = 'sh -c "$0" "$1" "$2" &'
_WRAPPER = 'cd "$0" && sh -c "$1" </dev/null >out 2>&1; echo $? >status.tmp; mv status.tmp status'


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
    found = []
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(v.startswith(f"{MARKER}={prefix}".encode()) for v in env):
            found.append(int(proc.name))
    return found


def execution_key(execution_id: str) -> str:
    return hashlib.sha256(execution_id.encode()).hexdigest()[:24]


class ExampleHandle(ext.Handle):
    def __init__(self, launch: dict[str, Any]) -> None:
        self.dir, self.marker = Path(launch["dir"]), launch["marker"]

    async def wait(self) -> ext.Result:
        while not (self.dir / "status").exists():
            if not await anyio.to_thread.run_sync(marked_processes, self.marker):
                if (self.dir / "status").exists():
                    break  # it wrote its status and exited since the first look
                raise ext.OperationError("job_vanished", "the job ended without an exit status")
            await anyio.sleep(0.1)
        status = int((self.dir / "status").read_text())
        outcome = ext.OutcomeKind.COMPLETED if status == 0 else ext.OutcomeKind.FAILED
        return ext.Result(outcome=outcome, summary=f"exit status {status}")


class ExampleExecutor(ext.Executor):
    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        config = decode_config(ctx.config)
        marker = f"{execution_key(ctx.execution_id)}/{ctx.epoch}"
        launch = Path(ctx.state_dir or tempfile.gettempdir(), "example", marker)
        intent = {"dir": str(launch), "marker": marker}
        await ctx.record_launch_intent(intent)  # durable before anything starts
        await anyio.to_thread.run_sync(lambda: launch.mkdir(parents=True, exist_ok=True))
        env = {**ctx.env, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), MARKER: marker,
               "CONDUIT_EXECUTION_ID": ctx.execution_id}  # fmt: skip
        argv = ["sh", "-c", _START, _WRAPPER, str(launch), config.command]
        await anyio.to_thread.run_sync(
            lambda: subprocess.run(argv, env=env, start_new_session=True, check=True)
        )
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
        prefix = f"{execution_key(target.execution_id)}/"
        with anyio.move_on_after(10):
            while pids := await anyio.to_thread.run_sync(marked_processes, prefix):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)  # no grace: the example keeps it short
                await anyio.sleep(0.05)
            return ext.StopEvidence(verified=True, detail="no process carries the launch marker")
        return ext.StopEvidence(verified=False, detail="marked processes survived SIGKILL for 10 s")


@ext.hookimpl
def conduit_executors() -> list[ext.ExecutorRegistration]:
    # check_config lets `conduit config check` refuse a bad binding before any attempt runs.
    return [
        ext.ExecutorRegistration(
            name="example", generation=1, executor=ExampleExecutor(), check_config=decode_config
        )
    ]
