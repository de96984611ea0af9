"""The shell executor: run, recover, stop, inject — one class shared by every generation.

Generations differ in the layout of their recovery metadata (see ``_metadata``), so one
implementation takes the generation and reads and writes that generation's layout. Generation 3
also records a launch intent before it creates or starts anything, and discovers a launch by it
when no metadata was recorded (see ``_discovery``); generations 1 and 2 fail closed there.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from conduit_core.extension import (
    ExecutionContext,
    Executor,
    Handle,
    InputEvent,
    LaunchPhaseName,
    NotAcceptingError,
    NotStartedError,
    OperationError,
    Result,
    StopEvidence,
    StopTarget,
    fault_point,
    is_store_outage,
)
from conduit_executors_shell._census import ProcessCensus
from conduit_executors_shell._config import ShellConfig, decode_config
from conduit_executors_shell._discovery import check_recorded_job, discover
from conduit_executors_shell._launch import EXECUTION_TAG, LAUNCH_MARKER, json_lines, launch_job
from conduit_executors_shell._launch_lock import held_by_a_launch, launch_lock
from conduit_executors_shell._metadata import (
    JobRecord,
    LaunchIntent,
    decode_intent,
    metadata_format,
)
from conduit_executors_shell._processes import (
    find_wrapper,
    group_is_empty,
    stop_job,
    wait_for_wrapper_exit,
)
from conduit_executors_shell._results import job_result, late_start_result, timeout_result
from conduit_executors_shell._workspace import (
    Workspace,
    create_workspace,
    read_tail,
    workspace_path,
)
from conduit_executors_shell._wrapper_checks import WrapperChecks

__all__ = ["CURRENT_GENERATION", "EXECUTOR_NAME", "ShellExecutor", "ShellHandle"]

EXECUTOR_NAME = "shell"
CURRENT_GENERATION = 3
#: The first generation that records a launch intent and can discover a launch by it.
_DISCOVERING_GENERATION = 3


class ShellExecutor(Executor):
    """Runs a binding's command as a detached process group that outlives the daemon."""

    def __init__(self, generation: int = CURRENT_GENERATION) -> None:
        self.generation = generation
        self._format = metadata_format(generation)
        self._children = _Children()
        # Shared by every recovery and observation of this executor: the identity checks in
        # flight at once (a restart adopting hundreds of jobs) cost one look, not one each.
        self._wrappers = WrapperChecks()
        # Likewise the process scans in flight (stops, their verification, recoveries looking
        # for a launch marker): one walk of the process table answers them all.
        self._census = ProcessCensus()

    def __repr__(self) -> str:
        return f"ShellExecutor(generation={self.generation})"

    async def run(self, ctx: ExecutionContext) -> Handle:
        config = decode_config(ctx.config)
        path = workspace_path(ctx.state_dir, ctx.execution_id, ctx.epoch)
        # Unique per launch, so a process of an earlier launch is never taken for this one.
        marker = f"{ctx.execution_id}/{ctx.epoch}/{secrets.token_hex(8)}"
        await fault_point("shell.before_intent")
        if self.generation >= _DISCOVERING_GENERATION:
            # Before anything exists: a recovery without metadata discovers the launch by this.
            intent = LaunchIntent(workspace=str(path), marker=marker)
            await ctx.record_launch_intent(msgspec.to_builtins(intent))
        await fault_point("shell.after_intent")
        async with ctx.phase(LaunchPhaseName.WORKSPACE):
            workspace = await anyio.to_thread.run_sync(create_workspace, path)
        # The phase's fenced begin and the spawn under one lock (see _launch_lock).
        async with launch_lock(path), ctx.phase(LaunchPhaseName.PROCESS_START):
            variables = _job_variables(ctx, workspace) | {LAUNCH_MARKER: marker}
            job = await anyio.to_thread.run_sync(
                lambda: launch_job(
                    config,
                    workspace,
                    inputs=ctx.inputs,
                    run_environment=ctx.env,
                    job_variables=variables,
                    marker=marker,
                    deadline_ms=ctx.deadline_ms,
                )
            )
            self._children.add(job.wrapper)
            await fault_point("shell.after_spawn")
            try:
                await ctx.persist_recovery(self._format.encode(job.record))
            except BaseException as exc:
                if self.generation >= _DISCOVERING_GENERATION and is_store_outage(exc):
                    # The store did not answer: the write may even have committed. The job is
                    # left running; the recovery that follows the outage adopts it, by this
                    # metadata or by the launch intent recorded before it started.
                    raise
                # Nobody can adopt a job whose metadata was refused (the lease is gone):
                # stop it now, while we still know exactly which process it is.
                with anyio.CancelScope(shield=True):
                    await self._stop_job(job.record, ctx.execution_id, config)
                raise
        return self._handle(config, job.record, ctx)

    async def recover(self, ctx: ExecutionContext) -> Handle:
        config = decode_config(ctx.config)
        discovering = self.generation >= _DISCOVERING_GENERATION
        if ctx.recovery is not None:
            record = self._format.decode(ctx.recovery)
            # A wrapper proven running is adopted whatever the workspace holds (as
            # ``check_recorded_job`` would); any other case takes that full check.
            # Generations 1 and 2 also require the workspace: they keep their own check.
            workspace = Workspace(Path(record.workspace))
            if not discovering:
                await anyio.to_thread.run_sync(_prove_recoverable, record, workspace)
            elif not await self._wrappers.alive(record):
                await check_recorded_job(record, workspace, self._census)
        elif not discovering:
            raise OperationError(
                "recovery_unprovable", "no recovery metadata was recorded for this attempt"
            )
        elif ctx.launch_intent is None:
            # This generation records the intent before it creates or starts anything.
            raise NotStartedError("no launch intent was recorded: nothing was started")
        else:
            record = await discover(decode_intent(ctx.launch_intent), self._census)
        # Re-recording under the new epoch is the fenced acknowledgement of the adoption.
        await ctx.persist_recovery(self._format.encode(record))
        return self._handle(config, record, ctx)

    async def stop(self, target: StopTarget) -> StopEvidence:
        record = self._format.decode(target.recovery) if target.recovery is not None else None
        launching = _intent_workspace(target.launch_intent) if record is None else None
        if launching is not None and await anyio.to_thread.run_sync(held_by_a_launch, launching):
            # An earlier launch of it may still start the job: nothing to prove yet.
            return StopEvidence(
                verified=False,
                detail=f"a launch still holds {launching}/launch.lock and may start the job",
            )
        try:
            config = decode_config(target.config)
        except OperationError:
            config = None  # A stop must still work for a binding that has since become invalid.
        return await self._stop_job(
            record, target.execution_id, config, marker=_intent_marker(target.launch_intent)
        )

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        return await self.stop(target)

    async def inject(self, target: StopTarget, inputs: Sequence[InputEvent]) -> None:
        config = decode_config(target.config)
        if not config.accept_input:
            raise NotAcceptingError("the shell binding does not set accept_input")
        if target.recovery is None:
            raise NotAcceptingError("the job has not been launched yet")
        record = self._format.decode(target.recovery)
        await anyio.to_thread.run_sync(_append_input, record, json_lines(inputs))

    async def output_tail(self, target: StopTarget, stream: str, max_bytes: int) -> bytes | None:
        """The tail of the job's ``stdout``/``stderr`` file in its workspace (the recorded one, or
        the one its launch intent names before the metadata is recorded)."""
        if stream not in ("stdout", "stderr"):
            return None
        if target.recovery is not None:
            try:
                folder: Path | None = Path(self._format.decode(target.recovery).workspace)
            except OperationError:
                folder = None
        else:
            folder = _intent_workspace(target.launch_intent)
        if folder is None:
            return None
        return await anyio.to_thread.run_sync(_tail_inside, folder / stream, target.state_dir,
                                              max_bytes)  # fmt: skip

    def _handle(self, config: ShellConfig, record: JobRecord, ctx: ExecutionContext) -> Handle:
        async def stop() -> StopEvidence:
            return await self._stop_job(record, ctx.execution_id, config)

        deadline = _deadline(config, record, ctx.deadline_ms)
        return ShellHandle(
            config, record, self._children, stop=stop, deadline=deadline, checks=self._wrappers
        )

    async def _stop_job(
        self,
        record: JobRecord | None,
        execution_id: str,
        config: ShellConfig | None,
        *,
        marker: str | None = None,
    ) -> StopEvidence:
        return await stop_job(
            record,
            execution_id=execution_id,
            marker=record.marker if record is not None else marker,
            stop_signal=config.signal() if config else signal.SIGTERM,
            grace_seconds=config.stop_grace_seconds if config else 10.0,
            reap=self._children.reap_all,
            census=self._census,
        )


def _tail_inside(path: Path, state_dir: str | None, max_bytes: int) -> bytes | None:
    """``read_tail`` of a workspace file, only inside the executor's state directory (a record
    naming another place is never a way to read any file)."""
    if state_dir is not None:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(Path(state_dir).resolve()):
            return None
        path = real
    return read_tail(path, max_bytes)


def _intent_workspace(intent: Mapping[str, Any] | None) -> Path | None:
    """The workspace a generation 3 intent names (an unreadable intent names none)."""
    if intent is None:
        return None
    try:
        return Path(decode_intent(intent).workspace)
    except OperationError:
        return None


def _intent_marker(intent: Mapping[str, Any] | None) -> str | None:
    """The launch marker a generation 3 intent names (an unreadable intent names none)."""
    if intent is None:
        return None
    try:
        return decode_intent(intent).marker
    except OperationError:
        return None


class _Children:
    """Wrappers this process started and has not reaped yet, by pid, so a stop can reap them."""

    def __init__(self) -> None:
        self._by_pid: dict[int, subprocess.Popen[bytes]] = {}

    def add(self, wrapper: subprocess.Popen[bytes]) -> None:
        self._by_pid[wrapper.pid] = wrapper

    def __contains__(self, pid: int) -> bool:
        return pid in self._by_pid

    def reap(self, pid: int) -> None:
        child = self._by_pid.get(pid)
        if child is not None and child.poll() is not None:
            del self._by_pid[pid]

    def reap_all(self) -> None:
        for pid in list(self._by_pid):
            self.reap(pid)


class ShellHandle(Handle):
    """Observes one job (launched or adopted) until it ends, and enforces its deadline."""

    def __init__(
        self,
        config: ShellConfig,
        record: JobRecord,
        children: _Children,
        *,
        stop: Callable[[], Awaitable[StopEvidence]],
        deadline: float | None,
        checks: WrapperChecks | None = None,
    ) -> None:
        self._config = config
        self._checks = checks
        self._record = record
        self._children = children
        self._stop = stop
        self._deadline = deadline
        self._workspace = Workspace(Path(record.workspace))

    async def wait(self) -> Result:
        pid = self._record.pid
        remaining = None if self._deadline is None else self._deadline - time.time()
        with anyio.move_on_after(remaining) as waiting:
            await wait_for_wrapper_exit(
                self._record,
                lambda: self._children.reap(pid),
                our_child=pid in self._children,
                proven=self._checks.alive if self._checks is not None else None,
            )
        if waiting.cancelled_caught and not await anyio.to_thread.run_sync(self._ended_by_itself):
            return await self._time_out()
        result = await anyio.to_thread.run_sync(self._result_unless_leftovers)
        if result is None:
            # Background processes the job left in its group end with it, so that a result
            # really means the job's resources are free.
            evidence = await self._stop()
            if not evidence.verified:
                raise OperationError("stop_unverified", evidence.detail)
            result = await anyio.to_thread.run_sync(self._result)
        return result

    async def _time_out(self) -> Result:
        evidence = await self._stop()
        if not evidence.verified:
            # A result would claim the job's resources are free; they are not proven to be.
            raise OperationError("stop_unverified", f"timeout, then {evidence.detail}")
        allowed = (self._deadline or time.time()) - self._record.launched_at
        return timeout_result(allowed, evidence.detail, wall_minutes=self._wall_minutes(None))

    def _ended_by_itself(self) -> bool:
        """The job recorded its exit status before anything stopped it: it ended on its own,
        though nobody looked before the deadline (a paused or late host). Its result stands."""
        try:
            return self._workspace.ended()
        except FileNotFoundError:
            return False

    def _result_unless_leftovers(self) -> Result | None:
        if self._workspace.not_started_past_deadline.exists():
            return late_start_result()  # The wrapper started nothing: nothing is left.
        self._exit_status()  # Raise before anything is stopped when the wrapper was lost.
        if not group_is_empty(self._record.pgid):
            return None
        return self._result()

    def _result(self) -> Result:
        status = self._exit_status()
        config = self._config
        self._workspace.keep_output_tail(config.max_stdout_bytes, config.max_stderr_bytes)
        return job_result(self._workspace, status, wall_minutes=self._wall_minutes(status))

    def _exit_status(self) -> int:
        status = self._workspace.recorded_exit_status()
        if status is None:
            raise OperationError(
                "supervisor_lost",
                f"the job's wrapper (pid {self._record.pid}) ended without recording an exit "
                "status; its processes are left for a verified stop",
            )
        return status

    def _wall_minutes(self, exit_status: int | None) -> float:
        # The job's whole run, launch to exit: only one segment ever observes the end, so a job
        # adopted after a restart is charged once, including the time no daemon watched it.
        ended = time.time()
        if exit_status is not None:
            ended = self._workspace.exit_status_path(exit_status).stat().st_mtime
        return max(0.0, ended - self._record.launched_at) / 60.0


def _job_variables(ctx: ExecutionContext, workspace: Workspace) -> dict[str, str]:
    return {
        "CONDUIT_RESULT": str(workspace.result),
        EXECUTION_TAG: ctx.execution_id,
        "CONDUIT_WORK_ID": ctx.work_id,
        "CONDUIT_ATTEMPT": str(ctx.attempt),
        "CONDUIT_EPOCH": str(ctx.epoch),
    }


def _deadline(config: ShellConfig, record: JobRecord, deadline_ms: int | None) -> float | None:
    """The wall-clock instant the job times out: the binding's timeout or the attempt's deadline."""
    candidates = []
    if config.timeout_seconds is not None:
        candidates.append(record.launched_at + config.timeout_seconds)
    if deadline_ms is not None:
        candidates.append(deadline_ms / 1000.0)
    return min(candidates) if candidates else None


def _prove_recoverable(record: JobRecord, workspace: Workspace) -> None:
    """Adopt only a job provably ours and running, or provably finished; else fail closed."""
    try:
        if workspace.ended():
            return
    except FileNotFoundError:
        raise OperationError(
            "recovery_unprovable", f"the job's workspace {record.workspace!r} is gone"
        ) from None
    if find_wrapper(record) is not None:
        return
    # The wrapper may have recorded its status and exited between the two looks.
    if workspace.ended():
        return
    raise OperationError(
        "recovery_unprovable",
        f"the job's wrapper (pid {record.pid}) is gone or its pid now belongs to another process, "
        "and no exit status was recorded",
    )


def _append_input(record: JobRecord, lines: bytes) -> None:
    workspace = Workspace(Path(record.workspace))
    if workspace.ended() or find_wrapper(record) is None:
        raise NotAcceptingError("the job has ended")
    # One O_APPEND write per batch, so concurrent injects never interleave within a line.
    fd = os.open(workspace.input, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, lines)
    finally:
        os.close(fd)
