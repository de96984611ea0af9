"""The Python SDK for executor programs: serve ordinary :class:`Executor` objects over the wire.

An executor program implements the same contract as an in-process executor (``run``,
``recover``, ``stop``, …, with an :class:`ExecutionContext` whose fenced callbacks travel to the
core and back) and ends with ``serve(manifest, {generation: executor})``. The SDK answers the
handshake, multiplexes requests (each runs as its own task), keeps the handles ``wait`` refers
to, validates results (and their ``data`` against the declared type) before they leave, and
maps errors to coded ``failed`` replies. Frames go to a private copy of stdout: anything the
executor code prints lands on stderr instead of corrupting the stream.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, BinaryIO

import msgspec

from conduit_core.errors import LeaseLostError
from conduit_core.extension._executor import (
    ExecutionContext,
    Executor,
    Handle,
    PhaseOutcome,
    StopEvidence,
    StopTarget,
)
from conduit_core.extension._results import OperationError, Result, validate_result
from conduit_core.extension.wire._codec import (
    HEADER,
    WireProtocolError,
    decode_core_message,
    encode_frame,
    frame_length,
)
from conduit_core.extension.wire._messages import (
    PROTOCOL_VERSION,
    AttemptContext,
    CallbackOk,
    CallbackRefused,
    Cancel,
    Finished,
    Handshake,
    HandshakeOk,
    Inject,
    Interrupt,
    Launched,
    LeaseLost,
    Output,
    OutputText,
    PersistRecovery,
    PhaseBegin,
    PhaseEnd,
    Pin,
    RecordLaunchIntent,
    Recover,
    Replied,
    RequestFailed,
    Resume,
    Run,
    Shutdown,
    Stop,
    Stopped,
    Target,
    Wait,
    WireError,
    WireManifest,
)

__all__ = ["serve", "manifest_for"]

_CALLBACK_REPLIES = ("callback_ok", "lease_lost", "callback_refused")
_MAX_TEXT = 4096
#: Finished handles kept answerable (a repeated wait); older ones are forgotten.
_KEEP_FINISHED = 10_000


def manifest_for(
    *,
    name: str,
    generation: int,
    pool: str | None = None,
    historical_generations: list[int] | None = None,
    capabilities: list[str] | None = None,
    description: str = "",
    config_type: Any = None,
    result_data: Any = None,
) -> WireManifest:
    """A handshake manifest; ``config_type`` / ``result_data`` (msgspec types) become schemas."""
    return msgspec.convert(
        {
            "name": name,
            "generation": generation,
            "pool": pool,
            "historical_generations": historical_generations or [],
            "capabilities": capabilities or [],
            "description": description,
            "config_schema": None if config_type is None else msgspec.json.schema(config_type),
            "result_data_schema": None if result_data is None else msgspec.json.schema(result_data),
        },
        WireManifest,
    )


def serve(
    manifest: WireManifest,
    executors: Mapping[int, Executor],
    *,
    result_data: Any = None,
) -> None:
    """Serve ``executors`` (one per generation the manifest declares) until the core leaves.

    ``result_data``: a msgspec type every result's ``data`` must convert to; a result that does
    not is refused here as ``invalid_result`` naming the ``$.data`` path.
    """
    declared = {manifest.generation, *manifest.historical_generations}
    if set(executors) != declared:
        raise ValueError(
            f"the manifest declares generations {sorted(declared)} but executors are given for "
            f"{sorted(executors)}"
        )
    asyncio.run(_Server(manifest, executors, result_data).serve())


def _text(message: str) -> str:
    return message if len(message) <= _MAX_TEXT else message[: _MAX_TEXT - 1] + "…"


def _wire_error(exc: BaseException) -> WireError:
    if isinstance(exc, OperationError):
        return WireError(
            code=exc.code, message=_text(exc.message), permanent=exc.permanent,
            retry_hint=exc.retry_hint,
        )  # fmt: skip
    if isinstance(exc, LeaseLostError):
        return WireError(code="lease_lost", message=_text(exc.message))
    # Like in process: another exception's text may carry provider output, so only its type.
    return WireError(code="executor_error", message=f"executor raised {type(exc).__name__}")


class _Callbacks:
    """The fenced callbacks of one run/resume/recover request, sent to the core."""

    def __init__(self, server: _Server, request: int) -> None:
        self._server = server
        self._request = request

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        await self._server.call(
            lambda cid: RecordLaunchIntent(id=cid, request=self._request, intent=dict(intent))
        )

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        await self._server.call(
            lambda cid: PersistRecovery(id=cid, request=self._request, metadata=dict(metadata))
        )

    async def begin_phase(self, name: str) -> None:
        await self._server.call(lambda cid: PhaseBegin(id=cid, request=self._request, name=name))

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        await self._server.call(
            lambda cid: PhaseEnd(id=cid, request=self._request, name=name, outcome=outcome)
        )

    async def pin(self, ref: str) -> None:
        await self._server.call(lambda cid: Pin(id=cid, request=self._request, ref=ref))


class _Server:
    def __init__(
        self, manifest: WireManifest, executors: Mapping[int, Executor], result_data: Any
    ) -> None:
        self._manifest = manifest
        self._executors = dict(executors)
        self._result_data = result_data
        self._handles: dict[str, asyncio.Task[Result]] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._callbacks: dict[int, asyncio.Future[Any]] = {}
        self._next_callback = 0
        # Frames get a private copy of stdout; fd 1 then points at stderr, so a stray print()
        # of the executor's code cannot corrupt the stream.
        self._out: BinaryIO = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)

    def send(self, message: msgspec.Struct) -> None:
        self._out.write(encode_frame(message))

    async def call(self, build: Callable[[int], msgspec.Struct]) -> None:
        self._next_callback += 1
        cid = self._next_callback
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._callbacks[cid] = future
        try:
            self.send(build(cid))
            reply = await future
        finally:
            self._callbacks.pop(cid, None)
        if isinstance(reply, LeaseLost):
            raise LeaseLostError(reply.message or "the attempt's lease is lost")
        if isinstance(reply, CallbackRefused):
            raise OperationError(reply.error.code, reply.error.message)
        if isinstance(reply, WireProtocolError):
            raise OperationError(reply.code, reply.message)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        try:
            while True:
                try:
                    header = await reader.readexactly(HEADER.size)
                    body = await reader.readexactly(frame_length(header))
                except asyncio.IncompleteReadError:
                    return  # the core closed our stdin: it is gone
                except WireProtocolError as exc:
                    print(f"conduit wire: {exc.message}; closing", file=sys.stderr)
                    return  # the stream cannot be trusted past a bad length
                try:
                    message = decode_core_message(body)
                except WireProtocolError as exc:
                    self._refuse(exc)
                    continue
                if isinstance(message, Shutdown):
                    self.send(Replied(id=message.id))
                    return
                self._dispatch(message)
        finally:
            for task in list(self._tasks.values()):
                task.cancel()

    def _refuse(self, exc: WireProtocolError) -> None:
        print(f"conduit wire: {exc.code}: {exc.message}", file=sys.stderr)
        if exc.request_id is None:
            return
        if exc.kind in _CALLBACK_REPLIES:
            future = self._callbacks.get(exc.request_id)
            if future is not None and not future.done():
                future.set_result(exc)
            return
        error = WireError(code=exc.code, message=_text(exc.message))
        self.send(RequestFailed(id=exc.request_id, error=error))

    def _dispatch(self, message: Any) -> None:
        if isinstance(message, CallbackOk | LeaseLost | CallbackRefused):
            future = self._callbacks.get(message.id)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, Handshake):
            self.send(self._handshake(message))
        elif isinstance(message, Cancel):
            task = self._tasks.get(message.request)
            if task is not None:
                task.cancel()
            self.send(Replied(id=message.id))
        else:
            self._start(message.id, self._answer(message))

    def _start(self, request: int, work: Awaitable[msgspec.Struct]) -> None:
        async def run() -> None:
            try:
                reply = await work
            except asyncio.CancelledError:
                return  # a cancelled wait: the core asked for no answer
            except Exception as exc:
                if not isinstance(exc, OperationError | LeaseLostError):
                    traceback.print_exc(file=sys.stderr)
                reply = RequestFailed(id=request, error=_wire_error(exc))
            finally:
                self._tasks.pop(request, None)
            self.send(reply)

        self._tasks[request] = asyncio.get_running_loop().create_task(run())

    def _handshake(self, message: Handshake) -> msgspec.Struct:
        if message.min_version <= PROTOCOL_VERSION <= message.max_version:
            return HandshakeOk(id=message.id, version=PROTOCOL_VERSION, manifest=self._manifest)
        error = WireError(
            code="unsupported_protocol",
            message=f"this program speaks protocol version {PROTOCOL_VERSION}; the core offered "
            f"{message.min_version}..{message.max_version}",
        )
        return RequestFailed(id=message.id, error=error)

    def _executor(self, generation: int) -> Executor:
        try:
            return self._executors[generation]
        except KeyError:
            raise OperationError(
                "unsupported_generation",
                f"{self._manifest.name} generation {generation} is not served by this program "
                f"(it serves {sorted(self._executors)})",
            ) from None

    async def _answer(self, message: Any) -> msgspec.Struct:
        if isinstance(message, Run | Resume | Recover):
            ctx = self._context(message.id, message.context)
            executor = self._executor(message.context.generation)
            if isinstance(message, Run):
                handle = await executor.run(ctx)
            elif isinstance(message, Resume):
                handle = await executor.resume(ctx, message.wake)
            else:
                handle = await executor.recover(ctx)
            handle_id = uuid.uuid4().hex
            # Observe at once: a segment that already ended travels inline in ``launched``
            # (two frames fewer per quick attempt); otherwise ``wait`` awaits this same task.
            observed = asyncio.get_running_loop().create_task(self._observe(handle))
            await asyncio.sleep(0)
            if observed.done() and not observed.cancelled() and observed.exception() is None:
                return Launched(id=message.id, handle=handle_id, result=observed.result())
            self._handles[handle_id] = observed
            return Launched(id=message.id, handle=handle_id)
        if isinstance(message, Wait):
            return Finished(id=message.id, result=await self._wait(message.handle))
        if isinstance(message, Stop | Interrupt):
            executor = self._executor(message.target.generation)
            target = _stop_target(message.target)
            if isinstance(message, Stop):
                evidence: StopEvidence = await executor.stop(target)
            else:
                evidence = await executor.interrupt(target)
            return Stopped(id=message.id, verified=evidence.verified, detail=_text(evidence.detail))
        if isinstance(message, Inject):
            executor = self._executor(message.target.generation)
            await executor.inject(_stop_target(message.target), message.inputs)
            return Replied(id=message.id)
        if isinstance(message, Output):
            executor = self._executor(message.target.generation)
            target, most = _stop_target(message.target), message.max_bytes
            data = await executor.output_tail(target, message.stream, most)
            text = None if data is None else data[-most:].decode("utf-8", errors="replace")
            return OutputText(id=message.id, text=text)
        raise OperationError("wire_unknown_message", f"cannot answer {type(message).__name__}")

    async def _wait(self, handle_id: str) -> Result:
        observed = self._handles.get(handle_id)
        if observed is None:
            raise OperationError("unknown_handle", f"no handle {handle_id!r} in this program")
        # Shielded: a cancelled wait stops this observer only, the next wait finds the task.
        # The handle stays valid after its result went out (the core may have cancelled that
        # wait and ask again); only the oldest finished ones are dropped, past a bound.
        result = await asyncio.shield(observed)
        self._finished[handle_id] = None
        while len(self._finished) > _KEEP_FINISHED:
            self._handles.pop(self._finished.popitem(last=False)[0], None)
        return result

    async def _observe(self, handle: Handle) -> Result:
        result = await handle.wait()
        validate_result(result)
        if self._result_data is not None:
            try:
                msgspec.convert(result.data, self._result_data)
            except msgspec.ValidationError as exc:
                detail = str(exc).replace("`$", "`$.data")
                raise OperationError("invalid_result", f"result data: {detail}") from exc
        return result

    def _context(self, request: int, context: AttemptContext) -> ExecutionContext:
        return ExecutionContext(
            execution_id=context.execution_id, work_id=context.work_id, attempt=context.attempt,
            epoch=context.epoch, scope=context.scope, binding=context.binding,
            executor=context.executor, generation=context.generation, config=context.config,
            inputs=context.inputs, env=context.env, deadline_ms=context.deadline_ms,
            recovery=context.recovery, launch_intent=context.launch_intent,
            state_dir=context.state_dir, callbacks=_Callbacks(self, request),
        )  # fmt: skip


def _stop_target(target: Target) -> StopTarget:
    return StopTarget(
        execution_id=target.execution_id, epoch=target.epoch, work_id=target.work_id,
        config=target.config, recovery=target.recovery, launch_intent=target.launch_intent,
        state_dir=target.state_dir,
    )  # fmt: skip
