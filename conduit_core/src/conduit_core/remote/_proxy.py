"""The in-process proxy of an out-of-process executor: the contract calls mapped onto the wire.

A :class:`ProgramSupervisor` keeps one program running per executor name and restarts it with
exponential backoff when it exits, hangs (a request or the handshake times out) or writes
garbage. A :class:`RemoteExecutor` per declared generation sends ``run`` / ``recover`` / …
through it. When the program dies under an attempt (mid-launch or mid-wait), the attempt is
never rerun blindly: the call raises ``LostSightError`` and the core hands the attempt to
recovery, which claims it at the next epoch and sends ``recover`` (with the launch intent and
recovery metadata the callbacks recorded) to the restarted program — so every recovery, a
program restart's too, has an epoch of its own and shows as a ``recovered`` segment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from conduit_core.errors import LeaseLostError
from conduit_core.extension import (
    Capability,
    ExecutionContext,
    Executor,
    ExecutorManifest,
    Handle,
    InputEvent,
    LostSightError,
    NotAcceptingError,
    NotStartedError,
    OperationError,
    ResourcesGoneError,
    Result,
    StopEvidence,
    StopTarget,
    validate_result,
)
from conduit_core.extension.wire import (
    MAX_OUTPUT_BYTES,
    AttemptContext,
    Cancel,
    ExecutorMessage,
    Finished,
    Inject,
    Interrupt,
    Launched,
    Output,
    OutputText,
    Recover,
    Replied,
    RequestFailed,
    Resume,
    Run,
    Stop,
    Stopped,
    Target,
    Wait,
    WireError,
    WireManifest,
    WireProtocolError,
)
from conduit_core.remote._datacheck import check_data
from conduit_core.remote._program import CallbackLimits, ProgramConnection, ProgramGone

__all__ = ["ProgramSettings", "ProgramSupervisor", "RemoteExecutor"]

log = logging.getLogger("conduit.remote")

#: How many program restarts one call rides out before it gives up.
_MAX_REATTACH = 5
#: How long an ``output`` request may take (it serves a console poll).
_OUTPUT_WITHIN = 5.0


@dataclass(frozen=True, kw_only=True)
class ProgramSettings:
    handshake_timeout: float = 30.0
    #: run / recover / stop / inject must be answered within this (``wait`` has no limit).
    request_timeout: float = 120.0
    backoff_initial: float = 0.1
    #: The first wait after a start that failed (the program died or hung before its handshake):
    #: more likely a broken install than bad luck, and each start costs an interpreter's start-up,
    #: so it is not started again five times in its first second and a half (doubling as above).
    failed_start_initial: float = 1.0
    backoff_max: float = 10.0
    #: A program that lived this long before it died restarts at once (its failures reset).
    stable_after: float = 30.0
    #: Bounds on the program's callbacks (per attempt, and being recorded at once).
    callbacks: CallbackLimits = dataclasses.field(default_factory=CallbackLimits)


class ProgramSupervisor:
    """Starts, watches and restarts one executor program; what ``conduit doctor`` reports."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        expected: ExecutorManifest | None,
        settings: ProgramSettings,
        clock: Callable[[], float] = time.monotonic,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.command = tuple(command)
        #: Added over the daemon's environment, and the working directory, of every start.
        self.env = dict(env or {})
        self.cwd = cwd
        self.expected = expected
        self.settings = settings
        self._clock = clock
        self._conn: ProgramConnection | None = None
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._failures = 0
        self._started_at = 0.0
        #: When a start that failed may be tried again (``connection(wait_for_start=False)``).
        self._next_start = 0.0
        self.status = "not started"
        self.restarts = 0
        self.failed_starts = 0
        self.protocol_errors = 0
        self.last_error = ""

    def state(self) -> dict[str, Any]:
        conn = self._conn
        status, last_error = self.status, self.last_error
        if conn is not None and conn.alive:
            status = "running"
        elif conn is not None and conn.gone is not None and status in ("running", "gone"):
            # Died with nothing in flight: started again (and counted) by the next request.
            status, last_error = "gone", conn.gone.message
        return {
            "executor": self.name,
            "command": list(self.command),
            "status": status,
            "pid": conn.pid if conn is not None and conn.alive else None,
            "restarts": self.restarts,
            "failed_starts": self.failed_starts,
            "protocol_errors": self.protocol_errors,
            "last_error": last_error,
        }

    def _gone(self, gone: ProgramGone) -> None:
        # Said at once, from the process's own exit status; it restarts at its next request.
        self.status = "gone"
        self.last_error = gone.message
        log.warning("%s", gone.message)

    def _protocol_error(self, text: str) -> None:
        self.protocol_errors += 1
        self.last_error = text

    async def connection(self, *, wait_for_start: bool = True) -> ProgramConnection:
        """The running program, started (after its backoff) if need be.

        ``wait_for_start=False``: while the program's last start failed, fail at once with that
        failure instead of waiting for the next start (a stop or control then fails fast and is
        tried again by its caller, rather than queueing behind every other caller's backoff).
        """
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is not None and conn.alive and conn.loop is loop:
            return conn
        if not wait_for_start:
            self._fail_fast()
        lock = self._locks.setdefault(loop, asyncio.Lock())
        async with lock:
            conn = self._conn
            if conn is not None and conn.alive and conn.loop is loop:
                return conn
            if not wait_for_start:  # a start it queued behind may have failed meanwhile
                self._fail_fast()
            if conn is not None and conn.loop is loop and conn.gone is not None:
                lived = self._clock() - self._started_at
                self._failures = 0 if lived >= self.settings.stable_after else self._failures + 1
                self.restarts += 1
                self.last_error = conn.gone.message
                self.status = "restarting"
                self._conn = None  # counted (and logged) once, however many starts it takes
            elif conn is not None:
                conn.kill()  # made under another event loop (a test's): it cannot serve this one
            if self.status == "failed":  # counted from that failure, not from this call
                delay = max(self._next_start - self._clock(), 0.0)
            else:
                delay = self._backoff()
            if self.status == "restarting":
                # Names the program and the failure only, never a request's content.
                log.info("%s; restarting it in %.1f s", self.last_error, delay)
            await asyncio.sleep(delay)
            self._started_at = self._clock()
            fresh: ProgramConnection | None = None
            try:
                fresh = await ProgramConnection.start(
                    self.name, self.command, handshake_timeout=self.settings.handshake_timeout,
                    on_protocol_error=self._protocol_error, limits=self.settings.callbacks,
                    on_gone=self._gone, env=self.env, cwd=self.cwd,
                )  # fmt: skip
                assert fresh.manifest is not None
                check_same_executor(self.name, self.expected, fresh.manifest)
                conn = fresh
            except ProgramGone as exc:
                if fresh is not None:  # it answered, as another executor: not ours to keep
                    await fresh.shutdown(grace=1.0)
                self._failures += 1
                self._next_start = self._clock() + self._backoff(failed_start=True)
                self.failed_starts += 1
                self.status = "failed"
                self.last_error = exc.message
                # Only this executor's attempts and stops wait on it (invariant 12).
                log.warning("executor program %r did not start: %s; the next request starts it "
                            "again", self.name, exc.message)  # fmt: skip
                raise OperationError("executor_unavailable", exc.message) from exc
            self._conn = conn
            self.status = "running"
            return conn

    def _fail_fast(self) -> None:
        """While the last start failed and the next is not due, fail with that failure."""
        if self.status == "failed" and self._clock() < self._next_start:
            raise OperationError(
                "executor_unavailable",
                f"{self.last_error}; the next start is in {self._next_start - self._clock():.1f} s",
            )

    def _backoff(self, *, failed_start: bool = False) -> float:
        if not self._failures:
            return 0.0
        settings = self.settings
        initial = settings.failed_start_initial if failed_start else settings.backoff_initial
        delay: float = initial * 2 ** (self._failures - 1)
        return min(delay, settings.backoff_max)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.loop is asyncio.get_running_loop():
            await conn.shutdown()
        elif conn is not None:
            conn.kill()
        self.status = "stopped"


def check_same_executor(name: str, expected: ExecutorManifest | None, got: WireManifest) -> None:
    """The running program must still be the executor the plugin was loaded as."""
    if got.name != name:
        raise ProgramGone(
            f"executor {name!r}: the program's handshake names executor {got.name!r} in "
            f"$.manifest.name; it must equal {name!r}",
            code="executor_name_mismatch",
        )
    if expected is None:
        return
    for field in ("generation", "pool", "historical_generations", "capabilities"):
        want, have = getattr(expected, field), getattr(got, field)
        if want != have:
            raise ProgramGone(
                f"executor {name!r}: the program's handshake says manifest.{field} = {have!r} "
                f"but it was loaded with {want!r}"
            )


def attempt_context(ctx: ExecutionContext, *, with_env: bool) -> AttemptContext:
    return AttemptContext(
        execution_id=ctx.execution_id, work_id=ctx.work_id, attempt=ctx.attempt, epoch=ctx.epoch,
        scope=ctx.scope, binding=ctx.binding, executor=ctx.executor, generation=ctx.generation,
        config=dict(ctx.config), inputs=list(ctx.inputs),
        env=dict(ctx.env) if with_env else {}, deadline_ms=ctx.deadline_ms,
        recovery=ctx.recovery, launch_intent=ctx.launch_intent, state_dir=ctx.state_dir,
    )  # fmt: skip


def raise_wire_error(error: WireError) -> None:
    """The contract's exception for a coded ``failed`` reply."""
    if error.code == "not_started":
        raise NotStartedError(error.message)
    if error.code == "resources_gone":
        raise ResourcesGoneError(error.message)
    if error.code == "not_accepting":
        raise NotAcceptingError(error.message)
    if error.code == "lease_lost":
        raise LeaseLostError(error.message)
    raise OperationError(
        error.code, error.message, permanent=error.permanent, retry_hint=error.retry_hint
    )


class _InvalidReply(OperationError):
    """A well-framed reply that is not what the request takes (a wrong field, an unknown kind)."""


def _unexpected(reply: ExecutorMessage, wanted: str) -> OperationError:
    return OperationError(
        "wire_invalid_message", f"expected {wanted} in reply, got {type(reply).__name__}"
    )


class RemoteExecutor(Executor):
    """One generation of an out-of-process executor."""

    def __init__(
        self, supervisor: ProgramSupervisor, generation: int, data_schema: dict[str, Any] | None
    ) -> None:
        self.supervisor = supervisor
        self.generation = generation
        self.data_schema = data_schema

    @property
    def _timeout(self) -> float:
        return self.supervisor.settings.request_timeout

    async def run(self, ctx: ExecutionContext) -> Handle:
        return await self._launch(
            ctx, lambda rid: Run(id=rid, context=attempt_context(ctx, with_env=True))
        )

    async def resume(self, ctx: ExecutionContext, wake: InputEvent) -> Handle:
        return await self._launch(
            ctx, lambda rid: Resume(id=rid, context=attempt_context(ctx, with_env=True), wake=wake)
        )

    async def recover(self, ctx: ExecutionContext) -> Handle:
        return await self.reattach(ctx)

    async def _launch(
        self, ctx: ExecutionContext, build: Callable[[int], msgspec.Struct]
    ) -> RemoteHandle:
        conn = await self.supervisor.connection()
        recorded = (ctx.launch_intent, ctx.recovery)
        try:
            return await self._handle_from(conn, ctx, build)
        except ProgramGone as exc:
            # Died mid-launch: what it may have started is found through recovery, at the next
            # epoch (the core decides: adopt, relaunch only what is proven not started, hold).
            raise LostSightError(f"{exc.message}; the attempt goes through recovery") from exc
        except _InvalidReply as exc:
            if ctx.launch_intent is recorded[0] and ctx.recovery is recorded[1]:
                raise  # it recorded nothing, so it started nothing: an ordinary failure
            # It said it was launching (an intent, recovery metadata), then answered with
            # something unreadable: recovery asks it what runs, never a failure into a rerun.
            raise LostSightError(f"{exc.message}; the attempt goes through recovery") from exc

    async def _handle_from(
        self, conn: ProgramConnection, ctx: ExecutionContext, build: Callable[[int], msgspec.Struct]
    ) -> RemoteHandle:
        sent: list[int] = []

        def numbered(rid: int) -> msgspec.Struct:
            sent.append(rid)
            return build(rid)

        try:
            reply = await conn.request(numbered, within=self._timeout, context=ctx)
        except WireProtocolError as exc:
            conn.forget(sent[0])
            raise _InvalidReply(exc.code, exc.message) from exc
        except BaseException:
            if sent:
                conn.forget(sent[0])
            raise
        if isinstance(reply, Launched):
            return RemoteHandle(self, ctx, conn, reply.handle, sent[0], reply.result)
        conn.forget(sent[0])
        if isinstance(reply, RequestFailed):
            raise_wire_error(reply.error)
        raise _InvalidReply("wire_invalid_message", _unexpected(reply, "launched").message)

    async def reattach(self, ctx: ExecutionContext) -> RemoteHandle:
        """Recover ``ctx``'s attempt through the (restarted) program, riding out a few restarts
        of a program that dies while it answers."""
        last: ProgramGone | None = None
        for _ in range(_MAX_REATTACH):
            try:
                conn = await self.supervisor.connection()
            except OperationError as exc:  # it did not come up: the backoff grows, try again
                last = ProgramGone(exc.message)
                continue
            try:
                return await self._handle_from(
                    conn,
                    ctx,
                    lambda rid: Recover(id=rid, context=attempt_context(ctx, with_env=False)),
                )
            except ProgramGone as exc:
                last = exc
        raise OperationError(
            "executor_unavailable",
            f"executor {self.supervisor.name!r} kept dying ({last.message if last else ''}); the "
            "attempt goes through recovery",
        )

    async def _control(
        self, build: Callable[[int], msgspec.Struct], within: float | None = None
    ) -> ExecutorMessage:
        last: ProgramGone | None = None
        for _ in range(_MAX_REATTACH):
            # A program that does not start fails the control at once: its caller (the daemon's
            # stop/confirm pass, control dispatch) tries again later with a backoff of its own.
            conn = await self.supervisor.connection(wait_for_start=False)
            try:
                reply = await conn.request(build, within=within or self._timeout)
            except ProgramGone as exc:
                last = exc  # stop and inject are idempotent: ask the restarted program
                continue
            except WireProtocolError as exc:
                raise OperationError(exc.code, exc.message) from exc
            if isinstance(reply, RequestFailed):
                raise_wire_error(reply.error)
            return reply
        raise OperationError(
            "executor_unavailable",
            f"executor {self.supervisor.name!r} kept dying: {last.message if last else ''}",
        )

    def _target(self, target: StopTarget) -> Target:
        return Target(
            execution_id=target.execution_id, epoch=target.epoch, work_id=target.work_id,
            generation=self.generation, config=dict(target.config), recovery=target.recovery,
            launch_intent=target.launch_intent, state_dir=target.state_dir,
        )  # fmt: skip

    async def stop(self, target: StopTarget) -> StopEvidence:
        reply = await self._control(lambda rid: Stop(id=rid, target=self._target(target)))
        if not isinstance(reply, Stopped):
            raise _unexpected(reply, "stopped")
        return StopEvidence(verified=reply.verified, detail=reply.detail)

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        reply = await self._control(lambda rid: Interrupt(id=rid, target=self._target(target)))
        if not isinstance(reply, Stopped):
            raise _unexpected(reply, "stopped")
        return StopEvidence(verified=reply.verified, detail=reply.detail)

    async def output_tail(self, target: StopTarget, stream: str, max_bytes: int) -> bytes | None:
        """Asked of a program that declares the ``output`` capability (within ``_OUTPUT_WITHIN``:
        a console poll never waits on a slow program for long); ``None`` otherwise."""
        conn = await self.supervisor.connection(wait_for_start=False)
        if conn.manifest is None or Capability.OUTPUT not in conn.manifest.capabilities:
            return None
        most = min(max_bytes, MAX_OUTPUT_BYTES)
        reply = await self._control(
            lambda rid: Output(id=rid, target=self._target(target), stream=stream, max_bytes=most),
            within=_OUTPUT_WITHIN,
        )
        if not isinstance(reply, OutputText):
            raise _unexpected(reply, "output_text")
        return None if reply.text is None else reply.text.encode()[-most:]

    async def inject(self, target: StopTarget, inputs: Sequence[InputEvent]) -> None:
        reply = await self._control(
            lambda rid: Inject(id=rid, target=self._target(target), inputs=list(inputs))
        )
        if not isinstance(reply, Replied):
            raise _unexpected(reply, "replied")


def _cancel(rid: int, *, request: int) -> Cancel:
    return Cancel(id=rid, request=request)


class RemoteHandle(Handle):
    """A segment the program runs; ``wait`` follows it across program restarts."""

    def __init__(
        self,
        executor: RemoteExecutor,
        ctx: ExecutionContext,
        conn: ProgramConnection,
        handle: str,
        request: int,
        result: Result | None = None,
    ) -> None:
        self._executor = executor
        self._ctx = ctx
        self._conn = conn
        self._handle = handle
        self._request = request
        self._result = result

    def _checked(self, result: Result) -> Result:
        validate_result(result)  # as the SDK does before sending: checked both ends
        if self._executor.data_schema is not None:
            check_data(self._executor.data_schema, result.data)
        return result

    def _lost(self, conn: ProgramConnection, why: str) -> LostSightError:
        """The segment is out of sight: the core hands it to recovery at the next epoch."""
        conn.forget(self._request)
        return LostSightError(f"{why}; the attempt goes through recovery")

    async def wait(self) -> Result:
        if self._result is not None:  # it ended while launching: no wait travels
            self._conn.forget(self._request)
            return self._checked(self._result)
        while True:
            conn, handle = self._conn, self._handle
            sent: list[int] = []

            def build(rid: int, handle: str = handle, sent: list[int] = sent) -> Wait:
                sent.append(rid)
                return Wait(id=rid, handle=handle)

            try:
                reply = await conn.request(build, within=None)
            except ProgramGone as exc:
                raise self._lost(conn, exc.message) from exc
            except WireProtocolError as exc:
                conn.forget(self._request)
                raise OperationError(exc.code, exc.message) from exc
            except asyncio.CancelledError:
                # Stop observing only: the program keeps the job (and the handle) running.
                if sent:
                    conn.send_nowait(partial(_cancel, request=sent[0]))
                raise
            if isinstance(reply, RequestFailed) and reply.error.code == "unknown_handle":
                # The program no longer knows the handle (it answered a wait this side had
                # cancelled, and forgot it): find the segment again through recovery.
                raise self._lost(conn, f"executor {self._executor.supervisor.name!r} no longer "
                                 "knows the attempt's handle")  # fmt: skip
            conn.forget(self._request)
            if isinstance(reply, RequestFailed):
                raise_wire_error(reply.error)
            if not isinstance(reply, Finished):
                raise _unexpected(reply, "finished")
            return self._checked(reply.result)
