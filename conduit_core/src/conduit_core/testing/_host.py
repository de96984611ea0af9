"""A real host process for the crash cases: the core Scheduler on a SQLite store, plugins loaded.

Run as ``python -m conduit_core.testing._host ARGS.json``. In ``launch`` mode it submits one Work
and runs its attempt; with ``crash`` set it SIGKILLs itself at that launch point, from the
callback side: the executor's context is wrapped so that ``record_launch_intent`` or
``persist_recovery`` kills the process just before or just after the durable write. Nothing of
the executor is faked, so the kill lands wherever that executor really is in its launch.
In ``recover`` mode a fresh host whose clock is past the dead host's lease recovers the attempt
the way a restarted daemon does, and runs it to its end.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import anyio
import msgspec

from conduit_core.config import Binding
from conduit_core.extension import (
    ExecutionContext,
    Executor,
    Handle,
    InputEvent,
    StopEvidence,
    StopTarget,
)
from conduit_core.plugins import Plugins
from conduit_core.remote import ProgramSpec
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import open_store
from conduit_core.testing._jobs import submit

__all__ = ["BINDING", "LAUNCH_POINTS", "CrashPoint", "HostArgs", "programs_for", "run_host"]

BINDING = "subject"


class CrashPoint(StrEnum):
    """Where the launching host is SIGKILLed, relative to the executor's two durable writes."""

    BEFORE_INTENT = "before_intent"
    AFTER_INTENT = "after_intent"
    BEFORE_RECORD = "before_record"
    AFTER_RECORD = "after_record"
    #: Only for executors that pin (``ctx.pin``): killed after the sandbox or container was
    #: created, before its pin is written.
    BEFORE_PIN = "before_pin"


#: The points every executor's launch passes through (the conformance cases run each).
LAUNCH_POINTS = (
    CrashPoint.BEFORE_INTENT,
    CrashPoint.AFTER_INTENT,
    CrashPoint.BEFORE_RECORD,
    CrashPoint.AFTER_RECORD,
)


class HostArgs(msgspec.Struct, frozen=True, kw_only=True):
    mode: str  # "launch" or "recover"
    store: str
    state_dir: str
    work_id: str
    executor: str
    generation: int | None = None
    config: dict[str, Any] = {}
    crash: CrashPoint | None = None
    lease_ms: int = 60_000
    #: The recovering host's clock runs this far ahead, so the dead host's lease has expired.
    clock_offset_ms: int = 0
    #: An executor program declared as conduit.toml would (``[executors.NAME] command``).
    program: list[str] | None = None


def programs_for(executor: str, program: Sequence[str] | None) -> dict[str, ProgramSpec]:
    """``Plugins.load(programs=…)`` for an executor program declared like conduit.toml does."""
    return {} if program is None else {executor: ProgramSpec(command=tuple(program))}


class _OffsetClock:
    def __init__(self, offset_ms: int) -> None:
        self._system = SystemClock()
        self._offset_ms = offset_ms

    def now_ms(self) -> int:
        return self._system.now_ms() + self._offset_ms


def _die() -> None:
    # Flush nothing, clean nothing: exactly what a host killed at this instant leaves behind.
    os.kill(os.getpid(), signal.SIGKILL)


def _around(
    write: Callable[[Mapping[str, Any]], Awaitable[None]], *, before: bool, after: bool
) -> Callable[[Mapping[str, Any]], Awaitable[None]]:
    async def wrapped(value: Mapping[str, Any]) -> None:
        if before:
            _die()
        await write(value)
        if after:
            _die()

    return wrapped


def arm(ctx: ExecutionContext, point: CrashPoint) -> None:
    """Make this context's launch-intent or recovery write kill the host before or after it."""
    # Instance attributes shadow the methods: the executor calls them as always.
    setattr(  # noqa: B010 - assigning the method directly reads as a type error to mypy
        ctx,
        "record_launch_intent",
        _around(
            ctx.record_launch_intent,
            before=point is CrashPoint.BEFORE_INTENT,
            after=point is CrashPoint.AFTER_INTENT,
        ),
    )
    if point is CrashPoint.BEFORE_PIN:
        pin = ctx.pin

        async def pin_or_die(ref: str) -> None:
            _die()
            await pin(ref)

        setattr(ctx, "pin", pin_or_die)  # noqa: B010
    setattr(  # noqa: B010
        ctx,
        "persist_recovery",
        _around(
            ctx.persist_recovery,
            before=point is CrashPoint.BEFORE_RECORD,
            after=point is CrashPoint.AFTER_RECORD,
        ),
    )


class _CrashingExecutor(Executor):
    """The loaded executor, with its launches armed to crash at one point."""

    def __init__(self, inner: Executor, point: CrashPoint) -> None:
        self._inner = inner
        self._point = point

    async def run(self, ctx: ExecutionContext) -> Handle:
        arm(ctx, self._point)
        return await self._inner.run(ctx)

    async def resume(self, ctx: ExecutionContext, wake: InputEvent) -> Handle:
        arm(ctx, self._point)
        return await self._inner.resume(ctx, wake)

    async def recover(self, ctx: ExecutionContext) -> Handle:
        return await self._inner.recover(ctx)

    async def stop(self, target: StopTarget) -> StopEvidence:
        return await self._inner.stop(target)

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        return await self._inner.interrupt(target)


class _CrashingPlugins(Plugins):
    crash: CrashPoint | None = None

    def executor(self, name: str, generation: int) -> Executor:
        found = super().executor(name, generation)
        return found if self.crash is None else _CrashingExecutor(found, self.crash)


def options_for(args: HostArgs) -> SchedulerOptions:
    binding = Binding(executor=args.executor, generation=args.generation, config=args.config)
    return SchedulerOptions(
        owner=f"conduit-testing-{args.mode}-{os.getpid()}",
        lease_ms=args.lease_ms,
        bindings={BINDING: binding},
        state_dir=args.state_dir,
        # A retry spent by a crash must show as a second attempt, not wait five minutes.
        retry_delays_ms=(0, 0),
    )


async def run_host(args: HostArgs) -> None:
    programs = programs_for(args.executor, args.program)
    plugins = cast(_CrashingPlugins, _CrashingPlugins.load(programs=programs))
    plugins.crash = args.crash
    store = await open_store(Path(args.store))
    async with store:
        clock = _OffsetClock(args.clock_offset_ms)
        sched = Scheduler(store, clock, plugins, options_for(args))
        async with sched.keeping_leases():
            if args.mode == "launch":
                await submit(sched, BINDING, args.work_id)
                await sched.run_attempt(await sched.claim(args.work_id))
            else:
                for claim in await sched.recover_expired():
                    await sched.run_recovery(claim)
                # A Work the recovery left ready (a spent retry) runs too, so it shows.
                await sched.run_ready(limit=10)
        await plugins.close()


def main(argv: list[str]) -> None:
    args = msgspec.json.decode(Path(argv[1]).read_bytes(), type=HostArgs)
    anyio.run(run_host, args)


if __name__ == "__main__":
    main(sys.argv)
