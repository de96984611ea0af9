"""A scripted in-process executor: each attempt does what its first input's payload says.

Payload keys (all optional): ``outcome`` (completed, failed, handoff, waiting), ``summary``,
``permanent``, ``turn`` (a status), ``units`` (usage), ``retry_hint`` ({"unknown_reset": true}
or {"reset_in_ms": N}), ``wait`` ({"event_type", "correlation_key", "timeout_seconds"}),
``block`` (the name of a :data:`BARRIERS` event ``wait()`` blocks on), ``block_run`` (the name
of a barrier ``run`` blocks on before returning), ``launch_seconds`` (``run`` sleeps that long,
writing a phase), ``no_persist`` (return a handle without persisting recovery metadata),
``raise_run`` / ``raise_wait`` (an OperationError code to raise), ``pin`` (a ref ``run`` pins
before it blocks or persists), ``consumed`` (input ids the result says it consumed). Every call is recorded in
:data:`CALLS` so tests can assert exactly what the core asked.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio

from conduit_core.extension import (
    ExecutionContext,
    Executor,
    Handle,
    InputEvent,
    NotAcceptingError,
    NotStartedError,
    OperationError,
    OutcomeKind,
    ResourcesGoneError,
    Result,
    RetryHint,
    StopEvidence,
    StopTarget,
    Turn,
    Usage,
    WaitFor,
)

#: Named barriers tests create and set: ``BARRIERS["x"] = anyio.Event()``.
BARRIERS: dict[str, anyio.Event] = {}
#: (method, execution_id, epoch, extra) for every call the core made.
CALLS: list[tuple[str, str, int, Any]] = []
#: Targets ``stop`` was asked to stop; ``STOP_VERIFIED`` says what it answers.
STOP_VERIFIED = {"value": True}
#: How ``inject`` answers: "ok", "not_accepting" or "error".
INJECT_ANSWER = {"value": "ok"}
#: How ``recover`` answers: "adopt" (a handle), "adopt_block:NAME" (a handle whose wait blocks on
#: barrier NAME), "not_started" (NotStartedError), "gone" (ResourcesGoneError), "crash" (a
#: RuntimeError) or any other string (an OperationError code).
RECOVER_ANSWER = {"value": "adopt"}


def reset() -> None:
    BARRIERS.clear()
    CALLS.clear()
    STOP_VERIFIED["value"] = True
    INJECT_ANSWER["value"] = "ok"
    RECOVER_ANSWER["value"] = "adopt"


def _script(inputs: Sequence[InputEvent]) -> dict[str, Any]:
    for event in inputs:
        if isinstance(event.payload, dict):
            return event.payload
    return {}


class ScriptedHandle(Handle):
    def __init__(self, script: dict[str, Any], ctx: ExecutionContext, how: str) -> None:
        self.script = script
        self.ctx = ctx
        self.how = how

    async def wait(self) -> Result:
        script = self.script
        if "block" in script:
            await BARRIERS.setdefault(script["block"], anyio.Event()).wait()
        if script.get("raise_wait") == "not_started":
            # An executor that lost the segment and whose recovery says nothing started.
            raise NotStartedError("scripted: the executor lost track of it")
        if "raise_wait" in script:
            raise OperationError(script["raise_wait"], "scripted observation failure")
        outcome = OutcomeKind(script.get("outcome", "completed"))
        hint = None
        if "retry_hint" in script:
            raw = dict(script["retry_hint"])
            if "reset_in_ms" in raw:
                raw = {"reset_at_ms": int(time.time() * 1000) + raw.pop("reset_in_ms")}
            hint = RetryHint(**raw)
        wait = WaitFor(**script["wait"]) if "wait" in script else None
        return Result(
            outcome=outcome,
            summary=script.get("summary", f"{self.how} {outcome}"),
            turn=Turn(status=script["turn"]) if "turn" in script else None,
            usage=Usage(units=dict(script.get("units", {}))),
            permanent=bool(script.get("permanent", False)),
            retry_hint=hint,
            wait=wait,
            consumed_inputs=list(script.get("consumed", [])),
            data={"inputs": [e.payload for e in self.ctx.inputs], "how": self.how},
        )


class ScriptedExecutor(Executor):
    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, ctx: ExecutionContext) -> Handle:
        script = _script(ctx.inputs)
        CALLS.append(("run", ctx.execution_id, ctx.epoch, dict(ctx.env)))
        return await self._launch(ctx, script, "ran")

    async def _launch(self, ctx: ExecutionContext, script: dict[str, Any], how: str) -> Handle:
        if "launch_seconds" in script:
            async with ctx.phase("container_create"):
                await anyio.sleep(float(script["launch_seconds"]))
        if "pin" in script:
            await ctx.pin(str(script["pin"]))
        if "block_run" in script:
            await BARRIERS.setdefault(script["block_run"], anyio.Event()).wait()
        if script.get("raise_run") == "not_started":
            # An executor program that died mid-launch, and whose recovery found nothing.
            raise NotStartedError("scripted: the launch was lost before anything started")
        if "raise_run" in script:
            raise OperationError(
                script["raise_run"],
                "scripted launch failure",
                permanent=bool(script.get("permanent")),
            )
        if not script.get("no_persist"):
            await ctx.persist_recovery({"how": how, "epoch": ctx.epoch})
        return ScriptedHandle(script, ctx, how)

    async def resume(self, ctx: ExecutionContext, wake: InputEvent) -> Handle:
        CALLS.append(("resume", ctx.execution_id, ctx.epoch, wake.id))
        script = dict(wake.payload) if isinstance(wake.payload, dict) else {}
        return await self._launch(ctx, script, "resumed")

    async def recover(self, ctx: ExecutionContext) -> Handle:
        CALLS.append(("recover", ctx.execution_id, ctx.epoch, ctx.recovery))
        answer = RECOVER_ANSWER["value"]
        if answer == "not_started":
            raise NotStartedError()
        if answer == "gone":
            raise ResourcesGoneError("scripted: nothing left and no result")
        if answer == "crash":
            raise RuntimeError("scripted recovery crash")
        if answer.startswith("adopt_block:"):
            # Adopted, and its wait blocks on the named barrier (a job that may still run).
            block = answer.removeprefix("adopt_block:")
            return ScriptedHandle({"block": block}, ctx, "recovered")
        if answer != "adopt":
            raise OperationError(answer, "scripted: cannot tell")
        return ScriptedHandle(_script(ctx.inputs), ctx, "recovered")

    async def stop(self, target: StopTarget) -> StopEvidence:
        CALLS.append(("stop", target.execution_id, target.epoch, None))
        return StopEvidence(verified=STOP_VERIFIED["value"], detail="scripted")

    async def inject(self, target: StopTarget, inputs: Sequence[InputEvent]) -> None:
        CALLS.append(("inject", target.execution_id, target.epoch, [e.id for e in inputs]))
        answer = INJECT_ANSWER["value"]
        if answer == "not_accepting":
            raise NotAcceptingError()
        if answer == "error":
            raise OperationError("provider_down", "secret provider text that must not be stored")
