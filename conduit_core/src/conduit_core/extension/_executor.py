"""The executor contract: what the core asks of an executor and what it hands it.

Executors are async. The core calls them outside any storage transaction, under the attempt's
lease; every write they make on the attempt's behalf (recovery metadata, launch phases, a pin) goes
through the fenced callbacks of :class:`ExecutionContext`, which raise
:class:`~conduit_core.errors.LeaseLostError` once the attempt is no longer theirs.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

import msgspec

from conduit_core.extension._results import NotAcceptingError, OperationError, Result

__all__ = [
    "AttemptCallbacks",
    "Capability",
    "ExecutionContext",
    "Executor",
    "Handle",
    "InputEvent",
    "LaunchPhaseName",
    "PhaseOutcome",
    "StopEvidence",
    "StopTarget",
    "MAX_LAUNCH_INTENT_BYTES",
    "MAX_RECOVERY_METADATA_BYTES",
]

#: Recovery metadata is bounded opaque JSON; larger metadata is refused.
MAX_RECOVERY_METADATA_BYTES = 16 * 1024
#: A launch intent is bounded opaque JSON too.
MAX_LAUNCH_INTENT_BYTES = 16 * 1024


class Capability(StrEnum):
    """What an executor can do besides run/recover, declared in its manifest and pinned."""

    RESUME = "resume"
    INJECT = "inject"
    INTERRUPT = "interrupt"
    STOP = "stop"
    ISOLATED = "isolated"
    #: ``run`` makes a fenced context write (``record_launch_intent``, ``persist_recovery``, a
    #: phase's begin, ``pin``) before it starts anything: before any process, container, task
    #: or request that could act. The core's invoke mark then rides on that first write instead
    #: of a write of its own just before ``run`` (one store write fewer per launch); a crash
    #: before it leaves the launch provably unstarted, so recovery relaunches it.
    WRITES_FIRST = "writes_first"
    #: An out-of-process executor answers ``output`` (an in-process one overrides
    #: ``output_tail`` instead and needs no capability).
    OUTPUT = "output"


class LaunchPhaseName(StrEnum):
    """Named launch phases. Executors may also record their own inner steps by free name."""

    TOOLBELT = "toolbelt"
    SECRETS = "secrets"
    ENVIRONMENT = "environment"
    SANDBOX = "sandbox"
    CONTAINER = "container"
    EXECUTOR = "executor"
    WORKSPACE = "workspace"
    SANDBOX_PLAN = "sandbox_plan"
    CONTAINER_PLAN = "container_plan"
    CONTAINER_CREATE = "container_create"
    SANDBOX_PIN = "sandbox_pin"
    CONTAINER_PIN = "container_pin"
    #: An executor's own last step: starting the pinned container, or the job's process.
    CONTAINER_START = "container_start"
    PROCESS_START = "process_start"


class PhaseOutcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"


class InputEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One accepted input presented to an attempt (its pending batch, in order)."""

    id: str
    type: str
    payload: Any = None
    correlation_key: str | None = None
    accepted_at_ms: int = 0


class StopEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """What an executor proves after a stop: ``verified`` only when nothing can still run."""

    verified: bool
    detail: str = ""


class AttemptCallbacks(Protocol):
    """Fenced writes on behalf of one attempt; implemented by the runtime (or a test harness)."""

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None: ...

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None: ...

    async def begin_phase(self, name: str) -> None: ...

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None: ...

    async def pin(self, ref: str) -> None: ...


class StopTarget(msgspec.Struct, frozen=True, kw_only=True):
    """Which attempt to stop: its execution id and epoch, its binding config and recovery data.

    ``launch_intent`` is what the launch recorded before it started anything: with no recovery
    metadata (a crash between the two), it is how a stop finds exactly this launch's resources.
    ``state_dir`` is the executor's directory on this host (``ExecutionContext.state_dir``), for
    an intent that names a launch's files relative to it.
    """

    execution_id: str
    epoch: int
    work_id: str
    config: dict[str, Any] = {}
    recovery: dict[str, Any] | None = None
    launch_intent: dict[str, Any] | None = None
    state_dir: str | None = None


class ExecutionContext:
    """Everything an executor gets for one launch, resume or recovery.

    ``env`` is the run environment: it is never persisted or logged, so an executor must not put
    it into recovery metadata or results.
    """

    def __init__(
        self,
        *,
        execution_id: str,
        work_id: str,
        attempt: int,
        epoch: int,
        scope: str,
        binding: str,
        executor: str,
        generation: int,
        config: Mapping[str, Any],
        inputs: Sequence[InputEvent] = (),
        env: Mapping[str, str] | None = None,
        deadline_ms: int | None = None,
        recovery: Mapping[str, Any] | None = None,
        launch_intent: Mapping[str, Any] | None = None,
        state_dir: str | None = None,
        callbacks: AttemptCallbacks,
    ) -> None:
        self.execution_id = execution_id
        self.work_id = work_id
        self.attempt = attempt
        self.epoch = epoch
        self.scope = scope
        self.binding = binding
        self.executor = executor
        self.generation = generation
        self.config = config
        self.inputs = tuple(inputs)
        self.env: Mapping[str, str] = dict(env or {})
        self.deadline_ms = deadline_ms
        self.recovery = dict(recovery) if recovery is not None else None
        #: The launch intent recorded by this attempt's latest launch (see
        #: :meth:`record_launch_intent`); what ``recover`` discovers by when ``recovery`` is None.
        self.launch_intent = dict(launch_intent) if launch_intent is not None else None
        #: A directory this host gives the executor for files of its own (workspaces, logs).
        self.state_dir = state_dir
        self._callbacks = callbacks

    def __repr__(self) -> str:  # never show env: it may hold secrets
        return (
            f"ExecutionContext(execution_id={self.execution_id!r}, epoch={self.epoch}, "
            f"executor={self.executor!r}, generation={self.generation})"
        )

    def stop_target(self) -> StopTarget:
        return StopTarget(
            execution_id=self.execution_id,
            epoch=self.epoch,
            work_id=self.work_id,
            config=dict(self.config),
            recovery=self.recovery,
            launch_intent=self.launch_intent,
            state_dir=self.state_dir,
        )

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        """Durably record how to find this launch again; required before returning a handle."""
        await self._callbacks.persist_recovery(metadata)
        self.recovery = dict(metadata)

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        """Durably record, before starting anything external, how to find the launch again.

        The intent is the deterministic identity of what is about to be started (a workspace path
        and a per-attempt marker the process carries; a container's name and labels). A recovery
        of an attempt that recorded an intent but no recovery metadata gets it back as
        ``ctx.launch_intent`` and *discovers*: found running → adopt; found finished → return a
        handle whose ``wait`` reads the result; provably never started → raise
        :class:`NotStartedError` (relaunched, nothing counted); gone without a result → raise
        :class:`ResourcesGoneError`; cannot tell → any other error (the attempt is held).
        Fenced by the lease: raises ``LeaseLostError`` once the attempt is no longer yours, in
        which case nothing may be started.
        """
        await self._callbacks.record_launch_intent(intent)
        self.launch_intent = dict(intent)

    async def pin(self, ref: str) -> None:
        """Pin the sandbox or container bound for this segment (fenced by the lease)."""
        await self._callbacks.pin(ref)

    async def begin_phase(self, name: str) -> None:
        """Record that a launch phase begins (prefer :meth:`phase`, which also ends it)."""
        await self._callbacks.begin_phase(name)

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        """Record how a launch phase ended (an out-of-process executor reports both halves)."""
        await self._callbacks.end_phase(name, outcome)

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> AsyncIterator[None]:
        """Record a launch phase as it begins and as it ends, with its outcome."""
        await self.begin_phase(name)
        try:
            yield
        except BaseException as exc:
            outcome = PhaseOutcome.FAILED if isinstance(exc, Exception) else PhaseOutcome.CANCELLED
            with contextlib.suppress(Exception):
                await self.end_phase(name, outcome)
            raise
        await self.end_phase(name, PhaseOutcome.OK)


class Handle(ABC):
    """A launched (or adopted) attempt segment."""

    @abstractmethod
    async def wait(self) -> Result:
        """Wait until the segment ends and return its structured result.

        Cancelling ``wait`` stops observing only; it must not stop the work itself.
        """


class Executor(ABC):
    """An executor implementation for one (name, generation).

    ``run`` and ``recover`` are required. The optional capabilities raise until overridden, and
    the core only calls the ones the manifest declares for the pinned generation.
    """

    @abstractmethod
    async def run(self, ctx: ExecutionContext) -> Handle:
        """Start the attempt. Call ``ctx.persist_recovery`` before returning the handle."""

    async def resume(self, ctx: ExecutionContext, wake: InputEvent) -> Handle:
        """Continue a parked attempt after the event it waited for."""
        raise OperationError("unsupported", f"{type(self).__name__} cannot resume")

    @abstractmethod
    async def recover(self, ctx: ExecutionContext) -> Handle:
        """Re-attach to the attempt described by ``ctx.recovery`` (or discovered through
        ``ctx.launch_intent`` when no metadata was recorded).

        Return a handle (adopted, or finished: its ``wait`` reads the result); raise
        :class:`NotStartedError` when discovery proves nothing was started,
        :class:`ResourcesGoneError` when everything is provably gone without a result, and any
        other error when it cannot tell: the attempt is then held (no new attempt of its Work
        starts) until the pinned generation recovers it or a person confirms the stop.
        Call ``ctx.persist_recovery`` before returning the handle.
        """

    @abstractmethod
    async def stop(self, target: StopTarget) -> StopEvidence:
        """Stop everything the attempt started and prove it (verified-stop evidence)."""

    async def inject(self, target: StopTarget, inputs: Sequence[InputEvent]) -> None:
        """Deliver input to the running attempt; acknowledgement means accepted, not consumed."""
        raise NotAcceptingError()

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        """Interrupt the running attempt; by default the same path as ``stop``."""
        return await self.stop(target)

    async def output_tail(self, target: StopTarget, stream: str, max_bytes: int) -> bytes | None:
        """The last ``max_bytes`` bytes the attempt wrote so far to ``stream`` (``stdout`` or
        ``stderr``), running or ended; ``None`` when this executor keeps no such output (the
        default). Read only: it must never change or stop the job, and it may be called at any
        time by any daemon (the console's live output polls it)."""
        return None
