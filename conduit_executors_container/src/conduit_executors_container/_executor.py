"""The container executor: run, recover, stop and interrupt a binding's work in a container.

A launch binds its container before anything runs: plan (config, image), record the launch intent
(the container's deterministic name and labels), create (not start), pin the container id
through the lease-fenced callback, record the metadata, and only then start it. So a launch that
lost its lease before its pin started nothing and may be relaunched, and one after it is adopted.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import anyio
import anyio.to_thread

from conduit_core.extension import (
    ExecutionContext,
    Executor,
    Handle,
    LaunchPhaseName,
    NotStartedError,
    OperationError,
    StopEvidence,
    StopTarget,
)
from conduit_executors_container import _containers as containers
from conduit_executors_container._config import ContainerConfig, decode_config
from conduit_executors_container._engine import (
    Engine,
    container_name,
    labels_for,
    launch_intent,
)
from conduit_executors_container._handle import ContainerHandle
from conduit_executors_container._metadata import ContainerRecord, decode_record, encode_record
from conduit_executors_container._outcome import RecordedOutcome, read_outcome
from conduit_executors_container._reconcile import LabelledContainer, reconcile
from conduit_executors_container._recovery import locate_for_recovery, record_from_engine
from conduit_executors_container._results import create_result_dir, job_variables_paths

__all__ = ["CURRENT_GENERATION", "EXECUTOR_NAME", "ContainerExecutor"]

EXECUTOR_NAME = "container"
CURRENT_GENERATION = 1


class ContainerExecutor(Executor):
    """Runs a binding's work in a Docker container on the engine ``base_url`` names.

    Without ``base_url`` the engine comes from ``DOCKER_HOST`` (and the SDK's other ``DOCKER_*``
    variables), else the default unix socket.
    """

    def __init__(self, base_url: str | None = None, *, engine: Engine | None = None) -> None:
        self.engine = engine if engine is not None else Engine(base_url)

    def __repr__(self) -> str:
        return f"ContainerExecutor({self.engine!r})"

    async def run(self, ctx: ExecutionContext) -> Handle:
        async with ctx.phase(LaunchPhaseName.CONTAINER_PLAN):
            config = decode_config(ctx.config)
            present = await self.engine.call(containers.image_present, config.image)
            if not present and config.pull == "never":
                raise OperationError(
                    "image_missing",
                    f"image {config.image!r} is not present in the Docker Engine and the binding's "
                    "pull policy is 'never'; build or load it there, or set pull = 'if-missing'",
                    permanent=True,
                )
            result_dir = await anyio.to_thread.run_sync(
                create_result_dir, ctx.state_dir, ctx.execution_id, ctx.epoch, ctx.inputs
            )
        # Durable before the container exists: a recovery with no pin and no metadata finds the
        # container by these labels, or proves by their absence that nothing was created.
        await ctx.record_launch_intent(
            launch_intent(ctx.execution_id, ctx.epoch, ctx.work_id, str(result_dir))
        )
        container_id = await self._bind(ctx, config, result_dir, pull=not present)
        record = ContainerRecord(
            container_id=container_id,
            name=container_name(ctx.execution_id, ctx.epoch),
            epoch=ctx.epoch,
            result_dir=str(result_dir),
            launched_at=time.time(),
        )
        async with ctx.phase(LaunchPhaseName.CONTAINER_START):
            if _past(ctx.deadline_ms):
                # The host stalled mid-launch past the deadline: a container started now would
                # only be stopped, and the retry would run the job again. Nothing starts.
                with anyio.CancelScope(shield=True):
                    await self.engine.call(containers.discard, container_id)
                raise NotStartedError(
                    "the attempt's deadline passed before its container could start; the "
                    "created container was removed unstarted"
                )
            # Recorded before the start: if the lease is gone by now the container stays unstarted
            # and pinned, and the recovery that adopts it starts it exactly once.
            await ctx.persist_recovery(encode_record(record))
            await self._start(container_id)
        return self._handle(config, record, ctx)

    async def recover(self, ctx: ExecutionContext) -> Handle:
        config = decode_config(ctx.config)
        record = decode_record(ctx.recovery) if ctx.recovery is not None else None
        # An outcome recorded on this host is the container's end as first observed; it is
        # recorded before the container is removed, so it is looked for before the engine.
        recorded = await _recorded_outcome(ctx, record)
        if recorded is not None:
            await ctx.persist_recovery(encode_record(recorded.record))
            return self._handle(config, recorded.record, ctx, recorded=recorded)
        state = await self.engine.call(locate_for_recovery, ctx.execution_id, record)
        if state is None:
            if record is not None:
                # Recorded as started, yet neither on the engine nor with a recorded outcome:
                # removed by something else (or its outcome lost). Held rather than retried.
                raise OperationError(
                    "container_missing",
                    f"execution {ctx.execution_id!r} recorded container {record.name!r}, but "
                    "the engine has no such container any more and no outcome of it is "
                    f"recorded beside {record.result_dir!r}; its outcome cannot be proven",
                )
            # No metadata means the container was never started (it is recorded before its
            # start), and the engine lists none labelled with the execution: nothing ran.
            raise NotStartedError(
                f"the engine has no container labelled with execution {ctx.execution_id!r} and "
                "none was recorded as started"
            )
        if record is None:
            # The pin was written but the metadata was not: the engine's record says the rest.
            record = record_from_engine(state)
            found = await _read_outcome(record.result_dir, container_id=record.container_id)
            if found is not None:
                await ctx.persist_recovery(encode_record(found.record))
                return self._handle(config, found.record, ctx, recorded=found)
        if state["State"]["Status"] == "created":
            if _past(ctx.deadline_ms):
                # Starting it now is a launch past the deadline: the core stops (removes) it
                # and times the attempt out instead; its retry runs the job, once.
                raise OperationError(
                    "deadline_passed",
                    f"container {record.name!r} was created but never started, and the "
                    "attempt's deadline has passed: it is not started now",
                )
            # Pinned but never started (the launch lost its lease in between): this is the one
            # container of the attempt, and the engine starts a container only once.
            await self._start(record.container_id)
        # Re-recording under the new epoch is the fenced acknowledgement of the adoption.
        await ctx.persist_recovery(encode_record(record))
        return self._handle(config, record, ctx)

    async def stop(self, target: StopTarget) -> StopEvidence:
        try:
            grace: int | None = decode_config(target.config).grace_seconds()
        except OperationError:
            grace = None  # The engine kept the grace the container was created with.
        try:
            return await self.engine.call(
                containers.stop_execution, target.execution_id, target.epoch, grace
            )
        except OperationError as exc:
            return StopEvidence(verified=False, detail=f"{exc.code}: {exc.message}")

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        return await self.stop(target)

    async def output_tail(self, target: StopTarget, stream: str, max_bytes: int) -> bytes | None:
        """The engine's log of the attempt's container while it exists, else the tail captured
        into the result directory when it ended."""
        if stream not in ("stdout", "stderr"):
            return None
        name = container_name(target.execution_id, target.epoch)
        try:
            live = await self.engine.call_abandonable(containers.log_tail, name, stream, max_bytes)
        except OperationError:
            live = None
        if live is not None:
            return live
        if target.recovery is None:
            return None
        try:
            record = decode_record(target.recovery)
        except OperationError:
            return None
        return await anyio.to_thread.run_sync(_file_tail, Path(record.result_dir) / stream,
                                              target.state_dir, max_bytes)  # fmt: skip

    async def reconcile(
        self, live_executions: frozenset[str] = frozenset()
    ) -> list[LabelledContainer]:
        """Containers labelled by conduit whose execution is not in ``live_executions``."""
        return await self.engine.call(reconcile, live_executions=live_executions)

    async def _bind(
        self, ctx: ExecutionContext, config: ContainerConfig, result_dir: Path, *, pull: bool
    ) -> str:
        """Create the container and pin it; a container that was not pinned is removed."""
        name = container_name(ctx.execution_id, ctx.epoch)
        container_id: str | None = None
        pinned = False
        try:
            async with ctx.phase(LaunchPhaseName.CONTAINER_CREATE):
                await self.engine.call(
                    containers.remove_leftovers, ctx.execution_id, ctx.epoch, name
                )
                if pull:
                    await self.engine.call(containers.pull_image, config.image)
                container_id = await self.engine.call(
                    containers.create_container,
                    config,
                    name=name,
                    labels=labels_for(ctx.execution_id, ctx.epoch, ctx.work_id),
                    environment=_environment(ctx, config),
                    result_dir=result_dir,
                )
            async with ctx.phase(LaunchPhaseName.CONTAINER_PIN):
                await ctx.pin(container_id)
                pinned = True
        except BaseException:
            if container_id is not None and not pinned:
                # Nobody will adopt an unpinned container, and it never started: remove it now.
                with anyio.CancelScope(shield=True):
                    await self.engine.call(containers.discard, container_id)
            raise
        return container_id

    async def _start(self, container_id: str) -> None:
        try:
            await self.engine.call(containers.start_container, container_id)
        except OperationError as exc:
            if exc.code == "container_refused":
                # The engine could not start the job's process, so nothing of it runs.
                with anyio.CancelScope(shield=True):
                    await self.engine.call(containers.discard, container_id)
            raise

    def _handle(
        self,
        config: ContainerConfig,
        record: ContainerRecord,
        ctx: ExecutionContext,
        *,
        recorded: RecordedOutcome | None = None,
    ) -> ContainerHandle:
        deadline = _deadline(config, record, ctx.deadline_ms)
        return ContainerHandle(self.engine, config, record, deadline=deadline, recorded=recorded)


async def _recorded_outcome(
    ctx: ExecutionContext, record: ContainerRecord | None
) -> RecordedOutcome | None:
    """The outcome recorded for the recorded container, else for the launch intent's one."""
    if record is not None:
        return await _read_outcome(record.result_dir, container_id=record.container_id)
    intent = ctx.launch_intent or {}
    result_dir, name = intent.get("result_dir"), intent.get("name")
    if not isinstance(result_dir, str) or not isinstance(name, str):
        return None
    # No metadata: a handle never existed, so nothing should be recorded; if something is, it
    # is this launch's container's end and must not be taken for "never started".
    return await _read_outcome(result_dir, name=name)


async def _read_outcome(result_dir: str, **match: str) -> RecordedOutcome | None:
    return await anyio.to_thread.run_sync(functools.partial(read_outcome, result_dir, **match))


def _environment(ctx: ExecutionContext, config: ContainerConfig) -> dict[str, str]:
    # The binding's env wins over the run environment; the executor's own variables win over both.
    return {
        **ctx.env,
        **config.env,
        **job_variables_paths(),
        "CONDUIT_EXECUTION_ID": ctx.execution_id,
        "CONDUIT_WORK_ID": ctx.work_id,
        "CONDUIT_ATTEMPT": str(ctx.attempt),
        "CONDUIT_EPOCH": str(ctx.epoch),
    }


def _deadline(
    config: ContainerConfig, record: ContainerRecord, deadline_ms: int | None
) -> float | None:
    """The wall-clock instant the job times out: the binding's timeout or the attempt's deadline."""
    candidates = []
    if config.timeout_seconds is not None:
        candidates.append(record.launched_at + config.timeout_seconds)
    if deadline_ms is not None:
        candidates.append(deadline_ms / 1000.0)
    return min(candidates) if candidates else None


def _past(deadline_ms: int | None) -> bool:
    return deadline_ms is not None and time.time() * 1000 >= deadline_ms


def _file_tail(path: Path, state_dir: str | None, max_bytes: int) -> bytes | None:
    """The tail captured into the result directory, only inside the executor's state dir."""
    try:
        real = path.resolve(strict=True)
        if state_dir is not None and not real.is_relative_to(Path(state_dir).resolve()):
            return None
        data = real.read_bytes()
    except (OSError, RuntimeError):
        return None
    return data[-max_bytes:] if max_bytes else b""
