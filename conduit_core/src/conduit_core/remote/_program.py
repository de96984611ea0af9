"""One running executor program and the frames between it and the core.

A :class:`ProgramConnection` owns the child process (a :class:`ProgramProcess`, watched by its
pid rather than its pipe), a reader task that routes each reply to the
request waiting for it (by id) and runs each callback against the attempt's
:class:`ExecutionContext`, and the request-id counter. Anything wrong with the stream ends the
connection (:class:`ProgramGone`) rather than the daemon: the supervisor restarts the program
and the proxy sends the affected attempts through recovery.

Callbacks are bounded (:class:`CallbackLimits`, invariant 12): per attempt a count and a rate,
past which they are refused with a stable code without touching the store; per program a number
being recorded at once, past which the reader stops reading the program's output (the pipe
fills and the program's writes block), and the reader also waits while the program is not
reading its replies. So a flood costs the daemon bounded memory and a bounded share of its loop.

asyncio is used directly (not anyio task groups) because the executor contract gives the proxy
no lifetime scope to own a task group in: the connection's reader lives as long as its program.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from conduit_core.errors import ConduitError, LeaseLostError
from conduit_core.extension import ExecutionContext
from conduit_core.extension.wire import (
    HEADER,
    PROTOCOL_VERSION,
    CallbackOk,
    CallbackRefused,
    ExecutorMessage,
    Handshake,
    HandshakeOk,
    LeaseLost,
    PersistRecovery,
    PhaseBegin,
    PhaseEnd,
    Pin,
    RecordLaunchIntent,
    RequestFailed,
    Shutdown,
    WireError,
    WireManifest,
    WireProtocolError,
    decode_executor_message,
    encode_frame,
    frame_length,
)
from conduit_core.remote._process import ProgramProcess, describe_exit

__all__ = ["PROGRAM_ENV", "CallbackLimits", "ProgramConnection", "ProgramGone", "probe_program"]

log = logging.getLogger("conduit.remote")

#: Set in every executor program's environment to its executor name (lets a person, or a test,
#: find the program among processes).
PROGRAM_ENV = "CONDUIT_EXECUTOR_PROGRAM"
_CALLBACKS = (RecordLaunchIntent, PersistRecovery, PhaseBegin, PhaseEnd, Pin)
_CALLBACK_KINDS = ("launch_intent", "persist_recovery", "phase_begin", "phase_end", "pin")
#: The reader lets the event loop run after this many frames read without a pause.
_FRAMES_PER_TURN = 16
#: A reader past its refusal rate pauses this long beyond its debt (so it pauses now and then,
#: not after every refusal).
_REFUSAL_PAUSE_S = 0.02
#: After the end of a program's output, how long its exit may take to be seen (to say how it
#: ended) before it is taken for a program that closed its stdout and is killed.
_EXIT_AFTER_EOF_S = 2.0
#: How many ended run / resume / recover requests a connection remembers, so that a late
#: callback for one is answered ``lease_lost`` (the attempt is no longer the program's).
_ENDED_REMEMBERED = 10_000
#: After a program's stdout ends, how long its exit status may take to follow.
_EXIT_GRACE_S = 2.0
#: How often a handshake wait looks whether the program has exited.
_EXIT_POLL_S = 0.1


class ProgramGone(ConduitError):
    """The program exited, hung or wrote something that ends trust in the stream."""

    code = "executor_program_gone"


def _refusal(code: str, message: str) -> WireError:
    return WireError(code=code if code.islower() else "callback_failed", message=message[:4096])


@dataclass(frozen=True, kw_only=True)
class CallbackLimits:
    """How much one program may ask of the core through callbacks (``[executors.NAME]``)."""

    #: Callbacks one ``run`` / ``resume`` / ``recover`` request may make, refused ones included;
    #: past it each is refused with ``callback_limit_exceeded``.
    per_attempt: int = 1000
    #: Callbacks per second one such request may make on average (bursts of as many allowed);
    #: past it each is refused with ``callback_rate_exceeded``.
    per_second: float = 100.0
    #: Callbacks of one program being recorded at once; past it the core stops reading.
    in_flight: int = 256
    #: Refusals one program may cost per second on average (bursts of as many); past it the
    #: core reads the program's output only as fast as this (backpressure, no error). A refusal
    #: writes nothing to the store but still costs the event loop its reading and its answer:
    #: a flooding program gets a bounded share of the daemon's time, not all of it.
    refused_per_second: float = 2000.0


class _CallbackBudget:
    """One request's callbacks so far and its token bucket."""

    __slots__ = ("count", "refused", "tokens", "updated")

    def __init__(self, limits: CallbackLimits, now: float) -> None:
        self.count = 0
        self.tokens = limits.per_second
        self.updated = now
        self.refused: set[str] = set()


class ProgramConnection:
    """The core's side of one live executor program."""

    def __init__(
        self,
        name: str,
        process: ProgramProcess,
        on_protocol_error: Callable[[str], None],
        limits: CallbackLimits | None = None,
        on_gone: Callable[[ProgramGone], None] | None = None,
    ) -> None:
        self.name = name
        self.process = process
        self.loop = asyncio.get_running_loop()
        self.manifest: WireManifest | None = None
        self.gone: ProgramGone | None = None
        self._on_protocol_error = on_protocol_error
        self._on_gone = on_gone
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[ExecutorMessage]] = {}
        self._contexts: dict[int, ExecutionContext] = {}
        self._limits = limits or CallbackLimits()
        self._budgets: dict[int, _CallbackBudget] = {}
        self._callback_slots = asyncio.Semaphore(self._limits.in_flight)
        self._refusal_tokens = self._limits.refused_per_second
        self._refusal_at = self.loop.time()
        self._ended: dict[int, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._callback_tasks: set[asyncio.Task[None]] = set()
        self._frames = 0
        self._stdout_ended = False
        self._reader = self.loop.create_task(self._read_loop())
        # The process, not its pipe: a child that keeps stdout open must not hide the exit.
        process.exited.add_done_callback(self._process_exited)

    @classmethod
    async def start(
        cls,
        name: str,
        command: Sequence[str],
        *,
        handshake_timeout: float,
        on_protocol_error: Callable[[str], None],
        limits: CallbackLimits | None = None,
        on_gone: Callable[[ProgramGone], None] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ProgramConnection:
        env = {**os.environ, **(env or {}), PROGRAM_ENV: name}
        try:
            process = await ProgramProcess.start(command, env, cwd)
        except OSError as exc:
            raise ProgramGone(f"executor {name!r}: cannot start {command[0]!r}: {exc}") from exc
        conn = cls(name, process, on_protocol_error, limits, on_gone)
        try:
            reply = await conn._handshake_or_exit(command, handshake_timeout)
            conn.manifest = check_handshake(name, command, reply)
        except BaseException:
            conn.kill()
            await conn._reap()
            raise
        return conn

    async def _reap(self) -> None:
        """After a failed start's kill: its exit status read and its pipes closed (a child it
        left behind may hold one), so no process or transport is left to the garbage collector."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exit_status(), _EXIT_GRACE_S)
        self.process.close_pipes()

    async def _handshake_or_exit(self, command: Sequence[str], within: float) -> ExecutorMessage:
        """The handshake's reply, raced against the program's exit: a program that exits at once
        is reported as exited, with its status, not as a handshake timeout."""
        handshake = asyncio.ensure_future(self.request(
            lambda rid: Handshake(id=rid, min_version=PROTOCOL_VERSION,
                                  max_version=PROTOCOL_VERSION),
            within=within,
        ))  # fmt: skip
        exited = asyncio.ensure_future(self._exit_status())
        try:
            await asyncio.wait({handshake, exited}, return_when=asyncio.FIRST_COMPLETED)
            if handshake.done() and handshake.exception() is None:
                return handshake.result()
            if not exited.done() and self._stdout_ended:  # the exit follows its stdout's end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exited), _EXIT_GRACE_S)
            if exited.done():
                how = describe_exit(exited.result())
                raise ProgramGone(
                    f"executor {self.name!r} ({' '.join(command)}) {how} "
                    "before answering the handshake (its stderr is in the daemon's log)",
                    code="executor_program_exited",
                )
            return await handshake
        finally:
            for future in (handshake, exited):
                future.cancel()

    async def _exit_status(self) -> int:
        # The process itself (its pidfd), not its pipes, which a child it left behind may keep.
        return await asyncio.shield(self.process.exited)

    @property
    def alive(self) -> bool:
        return self.gone is None

    @property
    def pid(self) -> int:
        return self.process.pid

    async def request(
        self,
        build: Callable[[int], msgspec.Struct],
        *,
        within: float | None,
        context: ExecutionContext | None = None,
    ) -> ExecutorMessage:
        """Send one request and wait for its reply; a timeout means the program hangs."""
        if self.gone is not None:
            raise self.gone
        self._next_id += 1
        rid = self._next_id
        future: asyncio.Future[ExecutorMessage] = self.loop.create_future()
        self._pending[rid] = future
        if context is not None:
            self._contexts[rid] = context
        try:
            self._write(build(rid))
            if within is None:
                return await future
            try:
                return await asyncio.wait_for(asyncio.shield(future), within)
            except TimeoutError:
                self._end(ProgramGone(f"executor {self.name!r} did not answer within {within:g} s"))
                raise self.gone from None  # type: ignore[misc]
        finally:
            self._pending.pop(rid, None)
            if future.done() and not future.cancelled():
                # Failed by ``_end`` while nobody awaited it (the write found the pipe closed,
                # or the wait was cancelled): what this call raised says it, not a GC warning.
                future.exception()

    def last_request_id(self) -> int:
        return self._next_id

    def forget(self, request: int) -> None:
        """The attempt of ``request`` makes no more callbacks through this connection."""
        self._budgets.pop(request, None)
        if self._contexts.pop(request, None) is not None:
            self._ended[request] = None
            if len(self._ended) > _ENDED_REMEMBERED:
                del self._ended[next(iter(self._ended))]

    def send_nowait(self, build: Callable[[int], msgspec.Struct]) -> None:
        """Fire and forget (a cancel): its reply is read and dropped. Never raises: it is sent
        from a cancelled caller's cleanup, and a program found gone (its stdin closed before
        its reader saw the end) has nothing left to cancel."""
        if self.gone is None:
            self._next_id += 1
            self._write_quietly(build(self._next_id))

    def _write(self, message: msgspec.Struct) -> None:
        frame = encode_frame(message)
        stdin = self.process.stdin
        if self.gone is not None or stdin is None or stdin.is_closing():
            self._end(ProgramGone(f"executor {self.name!r}: its stdin is closed"))
            raise self.gone  # type: ignore[misc]
        stdin.write(frame)

    async def _read_loop(self) -> None:
        stdout = self.process.stdout
        reason = ""
        try:
            while True:
                header = await stdout.readexactly(HEADER.size)
                body = await stdout.readexactly(frame_length(header))
                try:
                    message = decode_executor_message(body)
                except WireProtocolError as exc:
                    if exc.code == "wire_malformed":
                        raise  # not even a JSON object: the stream is not to be trusted
                    self._refused(exc)
                    await self._pace_refusals()
                    continue
                if isinstance(message, _CALLBACKS):
                    await self._take_callback(message)
                elif not self._route(message) and not 0 < message.id <= self._next_id:
                    # An answer to no request ever sent costs its reading for nothing, as a
                    # refusal does (a late answer, to a cancel or a cancelled wait, is not one).
                    await self._pace_refusals()
                await self._backpressure()
        except asyncio.IncompleteReadError:
            # End of its output: it exited (say how), or it closed stdout and cannot answer.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.process.exited), _EXIT_AFTER_EOF_S)
            self._stdout_ended = True
        except WireProtocolError as exc:  # a bad length: nothing after it can be framed
            reason = f"executor {self.name!r} wrote garbage ({exc.code}: {exc.message})"
            self._on_protocol_error(reason)
        except Exception as exc:  # never let a reader failure escape unseen
            reason = f"executor {self.name!r}: reading its output failed: {type(exc).__name__}"
        if not reason and self.process.returncode is not None:
            reason = self._exit_reason(self.process.returncode)
        self._end(ProgramGone(reason or f"executor {self.name!r} closed its output"))

    def _refused(self, exc: WireProtocolError) -> None:
        """A well-framed but invalid message: fail what it answered, keep the stream."""
        text = f"executor {self.name!r} sent an invalid message ({exc.code}): {exc.message}"
        self._on_protocol_error(text)
        if exc.request_id is None:
            return
        if exc.kind in _CALLBACK_KINDS:
            self._write_quietly(CallbackRefused(id=exc.request_id, error=_refusal(exc.code, text)))
            return
        future = self._pending.get(exc.request_id)
        if future is not None and not future.done():
            future.set_exception(WireProtocolError(exc.code, text, request_id=exc.request_id))

    def _route(self, message: ExecutorMessage) -> bool:
        """Hand a reply to its request; ``False``: nobody waits for it (a cancelled wait, a late
        answer, an id never sent), so it is dropped."""
        future = self._pending.get(message.id)
        if future is not None and not future.done():
            future.set_result(message)
            return True
        return False

    async def _take_callback(self, message: Any) -> None:
        """Refuse it at once (unknown request, past a bound), or record it in a task of its own
        once fewer than ``in_flight`` are being recorded (until then nothing more is read)."""
        ctx = self._contexts.get(message.request)
        if ctx is None and message.request in self._ended:
            # Cancelled, settled or recovered since: the attempt is no longer this request's.
            text = (
                f"callback {message.id}: request {message.request} has ended (cancelled, settled "
                "or recovered): start nothing"
            )
            self._write_quietly(LeaseLost(id=message.id, message=text))
            await self._pace_refusals()
            return
        if ctx is None:
            error = _refusal(
                "unknown_request",
                f"callback {message.id}: $.request: {message.request} is no run, resume or recover "
                "of this program still in progress",
            )
            self._write_quietly(CallbackRefused(id=message.id, error=error))
            await self._pace_refusals()
            return
        refusal = self._over_bound(message, ctx)
        if refusal is not None:
            self._write_quietly(CallbackRefused(id=message.id, error=refusal))
            await self._pace_refusals()
            return
        await self._callback_slots.acquire()
        task = self.loop.create_task(self._callback(message, ctx))
        self._callback_tasks.add(task)
        task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[None]) -> None:
        self._callback_tasks.discard(task)
        self._callback_slots.release()

    def _over_bound(self, message: Any, ctx: ExecutionContext) -> WireError | None:
        """The refusal of a callback past its attempt's count or rate (``None``: within both)."""
        limits = self._limits
        now = self.loop.time()
        budget = self._budgets.get(message.request)
        if budget is None:
            budget = self._budgets[message.request] = _CallbackBudget(limits, now)
        budget.count += 1
        if budget.count > limits.per_attempt:
            code = "callback_limit_exceeded"
            text = (
                f"callback {message.id}: request {message.request} has made {limits.per_attempt} "
                "callbacks, the most one attempt may make (callbacks_per_attempt)"
            )
        else:
            budget.tokens = min(
                limits.per_second, budget.tokens + (now - budget.updated) * limits.per_second
            )
            budget.updated = now
            if budget.tokens >= 1:
                budget.tokens -= 1
                return None
            code = "callback_rate_exceeded"
            text = (
                f"callback {message.id}: request {message.request} makes more than "
                f"{limits.per_second:g} callbacks per second (callbacks_per_second); slow down"
            )
        if code not in budget.refused:  # said once per attempt and bound, not per callback
            budget.refused.add(code)
            line = f"executor {self.name!r}: {text}; refusing its callbacks with {code}"
            log.warning("%s execution=%s epoch=%s", line, ctx.execution_id, ctx.epoch)
            self._on_protocol_error(line)
        return WireError(code=code, message=text)

    async def _pace_refusals(self) -> None:
        """One more refusal (a callback refused, an invalid message, a reply to no request):
        past ``refused_per_second`` the reader waits out its debt (and ``_REFUSAL_PAUSE_S``
        more), so the program's pipe fills and its writes block."""
        rate = self._limits.refused_per_second
        now = self.loop.time()
        tokens = min(rate, self._refusal_tokens + (now - self._refusal_at) * rate) - 1
        self._refusal_tokens, self._refusal_at = tokens, now
        if tokens < 0:
            await asyncio.sleep(_REFUSAL_PAUSE_S - tokens / rate)

    async def _backpressure(self) -> None:
        """Let the loop run now and then (frames already buffered are read without a pause),
        and wait while the program does not read its replies (so they never pile up here)."""
        self._frames += 1
        if self._frames % _FRAMES_PER_TURN == 0:
            await asyncio.sleep(0)
        # Past the pipe's high-water mark the program is not reading its replies: read nothing
        # more until it does (or its pipe is gone).
        await self.process.writable.wait()

    async def _callback(self, message: Any, ctx: ExecutionContext) -> None:
        try:
            if isinstance(message, RecordLaunchIntent):
                await ctx.record_launch_intent(message.intent)
            elif isinstance(message, PersistRecovery):
                await ctx.persist_recovery(message.metadata)
            elif isinstance(message, PhaseBegin):
                await ctx.begin_phase(message.name)
            elif isinstance(message, PhaseEnd):
                await ctx.end_phase(message.name, message.outcome)
            else:
                await ctx.pin(message.ref)
        except LeaseLostError as exc:
            self._write_quietly(LeaseLost(id=message.id, message=exc.message[:4096]))
            return
        except ConduitError as exc:
            self._write_quietly(
                CallbackRefused(id=message.id, error=_refusal(exc.code, exc.message))
            )
            return
        except Exception as exc:
            error = _refusal(
                "callback_failed", f"the core could not record it: {type(exc).__name__}"
            )
            self._write_quietly(CallbackRefused(id=message.id, error=error))
            return
        self._write_quietly(CallbackOk(id=message.id))

    def _write_quietly(self, message: msgspec.Struct) -> None:
        with contextlib.suppress(ConduitError, OSError, RuntimeError):
            self._write(message)

    def _exit_reason(self, returncode: int) -> str:
        before = " before answering the handshake" if self.manifest is None else ""
        how = describe_exit(returncode)
        return f"executor {self.name!r} {how}{before} (pid {self.process.pid})"

    def _process_exited(self, exited: asyncio.Future[int]) -> None:
        if not exited.cancelled():
            self._end(ProgramGone(self._exit_reason(exited.result())))

    def _end(self, gone: ProgramGone) -> None:
        if self.gone is not None:
            return
        self.gone = gone
        for future in self._pending.values():
            if not future.done():
                future.set_exception(gone)
        self.kill()
        if self._reader is not asyncio.current_task():
            self._reader.cancel()  # its output may stay open (a child holds it): stop reading
        if self._on_gone is not None:
            self._on_gone(gone)

    def kill(self) -> None:
        # The program started its jobs detached: killing it never touches a job.
        self.process.kill()
        if self.gone is None:
            self.gone = ProgramGone(f"executor {self.name!r} was stopped")
        self.process.close_pipes()
        if self.loop.is_closed() or self.loop is not _running_loop():
            self.process.reap_now()  # its loop (a test's) cannot watch it any more

    async def shutdown(self, grace: float = 5.0) -> None:
        """Ask the program to exit; kill it if it does not."""
        self._on_gone = None  # its exit is asked for: nothing to report
        if self.gone is None:
            with contextlib.suppress(ConduitError, TimeoutError, OSError):
                await self.request(lambda rid: Shutdown(id=rid), within=grace)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.process.exited), grace)
        self.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.process.exited), grace)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def check_handshake(name: str, command: Sequence[str], reply: ExecutorMessage) -> WireManifest:
    """The program's manifest from its handshake reply; a version mismatch names both sides."""
    if isinstance(reply, RequestFailed):
        raise ProgramGone(
            f"executor {name!r} ({' '.join(command)}) refused the handshake for protocol version "
            f"{PROTOCOL_VERSION}..{PROTOCOL_VERSION}: {reply.error.code}: {reply.error.message}",
            code="wire_version_mismatch" if reply.error.code == "unsupported_protocol" else None,
        )
    if not isinstance(reply, HandshakeOk):
        raise ProgramGone(
            f"executor {name!r}: answered the handshake with {type(reply).__name__}",
            code="wire_invalid_message",
        )
    if reply.version != PROTOCOL_VERSION:
        raise ProgramGone(
            f"executor {name!r} ({' '.join(command)}) speaks protocol version {reply.version}; "
            f"this conduit speaks {PROTOCOL_VERSION}..{PROTOCOL_VERSION}",
            code="wire_version_mismatch",
        )
    return reply.manifest


def probe_program(
    name: str, command: Sequence[str], *, timeout: float, environ: Mapping[str, str] | None = None
) -> WireManifest:
    """Start the program, shake hands, shut it down: its manifest (blocking; used at load)."""
    env = {**(environ if environ is not None else os.environ), PROGRAM_ENV: name}
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen(
                list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                env=env, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise ProgramGone(f"executor {name!r}: cannot start {command[0]!r}: {exc}") from exc
        try:
            assert proc.stdin is not None
            assert proc.stdout is not None
            try:
                proc.stdin.write(
                    encode_frame(
                        Handshake(id=1, min_version=PROTOCOL_VERSION, max_version=PROTOCOL_VERSION)
                    )
                )
                proc.stdin.flush()
            except OSError:
                pass  # it exited at once: reading says so
            reply = _read_reply(name, proc.stdout.fileno(), time.monotonic() + timeout, proc.poll)
            if reply is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_EXIT_GRACE_S)  # its stdout ended: the exit follows
                errors.seek(0)
                tail = errors.read()[-2000:].decode("utf-8", "replace").strip()
                wrote = f"; it wrote: {tail}" if tail else "; it wrote nothing to stderr"
                if proc.returncode is not None:
                    raise ProgramGone(
                        f"executor {name!r} ({' '.join(command)}) {describe_exit(proc.returncode)} "
                        f"before answering the handshake{wrote}",
                        code="executor_program_exited",
                    )
                raise ProgramGone(
                    f"executor {name!r} ({' '.join(command)}) gave no handshake within "
                    f"{timeout:g} s" + (f"; it wrote: {tail}" if tail else "")
                )
            manifest = check_handshake(name, command, reply)
            with contextlib.suppress(OSError):
                proc.stdin.write(encode_frame(Shutdown(id=2)))
                proc.stdin.close()
            return manifest
        finally:
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _read_reply(
    name: str, fd: int, deadline: float, exited: Callable[[], int | None]
) -> ExecutorMessage | None:
    """The first frame; ``None`` at the deadline, at end of file, or once the program exited
    (a child of it may keep the pipe open)."""
    buffer = b""
    need = HEADER.size
    header_done = False
    while True:
        while len(buffer) < need:
            left = deadline - time.monotonic()
            if left <= 0 or (exited() is not None and not select.select([fd], [], [], 0)[0]):
                return None
            if not select.select([fd], [], [], min(left, _EXIT_POLL_S))[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buffer += chunk
        if not header_done:
            try:
                need = HEADER.size + frame_length(buffer[: HEADER.size])
            except WireProtocolError as exc:
                raise ProgramGone(f"executor {name!r}: {exc.message}", code=exc.code) from exc
            header_done = True
            continue
        try:
            return decode_executor_message(buffer[HEADER.size : need])
        except WireProtocolError as exc:
            raise ProgramGone(
                f"executor {name!r}: bad handshake reply: {exc.message}", code=exc.code
            ) from exc
